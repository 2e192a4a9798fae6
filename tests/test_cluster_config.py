"""cluster.yaml validates against Ray's own launcher schema, offline."""

from pathlib import Path

import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = Path(__file__).resolve().parents[1]


def test_cluster_yaml_is_valid_for_ray_up():
    raw = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    validate_config(prepare_config(raw))
    nodes = raw["available_node_types"]
    assert raw["head_node_type"] in nodes
    assert nodes["head"]["resources"]["CPU"] == 0
    assert nodes["gpu_worker"]["resources"]["GPU"] >= 1
    for name, node in nodes.items():
        assert node.get("min_workers", 0) <= node.get("max_workers", 0) or name == "head"


def test_cluster_profile_example_matches_the_launcher_image():
    raw = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    import ray

    assert raw["docker"]["image"].startswith(f"rayproject/ray:{ray.__version__}")
