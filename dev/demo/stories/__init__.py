"""The demo's stories, one module each, in the order the demo tells them: throughput, gangs, gpu (packing), pools,
race (a foreign scheduler), devices (DRA). Each returns its figures as a dataclass the report carries."""
