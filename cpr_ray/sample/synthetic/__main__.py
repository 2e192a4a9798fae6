"""`python -m cpr_ray.sample.synthetic OUT --papers N --citations M`."""

from cpr_ray.sample.synthetic.generate import main

main()
