"""The OpenAlex topic hierarchy above the topic level: 4 domains and 26 fields.

Topics and subfields are too many to ship and come with every work record; fields and domains are
fixed by OpenAlex and needed without any data (sampling an equal number of base papers per field,
the synthetic generator, per-domain metrics), so they live here once.
"""

from __future__ import annotations

DOMAINS: dict[int, str] = {
    1: "Life Sciences",
    2: "Social Sciences",
    3: "Physical Sciences",
    4: "Health Sciences",
}

# field id -> (field name, domain id)
FIELDS: dict[int, tuple[str, int]] = {
    11: ("Agricultural and Biological Sciences", 1),
    12: ("Arts and Humanities", 2),
    13: ("Biochemistry, Genetics and Molecular Biology", 1),
    14: ("Business, Management and Accounting", 2),
    15: ("Chemical Engineering", 3),
    16: ("Chemistry", 3),
    17: ("Computer Science", 3),
    18: ("Decision Sciences", 2),
    19: ("Earth and Planetary Sciences", 3),
    20: ("Economics, Econometrics and Finance", 2),
    21: ("Energy", 3),
    22: ("Engineering", 3),
    23: ("Environmental Science", 3),
    24: ("Immunology and Microbiology", 1),
    25: ("Materials Science", 3),
    26: ("Mathematics", 3),
    27: ("Medicine", 4),
    28: ("Neuroscience", 1),
    29: ("Nursing", 4),
    30: ("Pharmacology, Toxicology and Pharmaceutics", 1),
    31: ("Physics and Astronomy", 3),
    32: ("Psychology", 2),
    33: ("Social Sciences", 2),
    34: ("Veterinary", 4),
    35: ("Dentistry", 4),
    36: ("Health Professions", 4),
}


def field_name(field_id: int) -> str:
    return FIELDS[field_id][0]


def domain_of_field(field_id: int) -> int:
    return FIELDS[field_id][1]
