"""A 3 MB stand-in checkpoint shard: made on the fleet's seed by tests/fleet/deploy_artifacts.py (as
its download from the hub would be), checked on every worker by tests/fleet/test_artifacts_fleet.py."""

CHECKPOINT = "/srv/fleet-test-model"
SHARD = "model-00001-of-00001.safetensors"
SIZE = 3 << 20
LINE = "fleet-test-shard"
# The same bytes on the host (coreutils) and here.
COMMAND = f"yes {LINE} | head -c {SIZE}"


def shard() -> bytes:
    line = (LINE + "\n").encode()
    return (line * (SIZE // len(line) + 1))[:SIZE]
