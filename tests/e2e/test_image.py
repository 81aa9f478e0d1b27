"""The container image (`make image`), run as the kubelet runs it: the entrypoint (tini) and the image's user
(10001). Every console script answers --help inside it, and each service starts inside it against the local
plane until it answers its health check, then stops on SIGTERM with code 0.

The image is the one `make image` built (`dev.image.default_image()`, or $HOSS_IMAGE); the test builds it the
same way when it is missing. Containers run with buildah's chroot isolation on the host's network, the plane's
credentials mounted read-only at their own paths (copies owned by the image's user: the plane's keys are readable
by their owner only). Building takes minutes, so `make image-test` runs this module and `make test` leaves it out
(marker ``image``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dev import image as images
from dev.local.plane import POLICIES_FILE, ROUTING_FILE, LocalPlane
from tests.e2e.console_scripts import SCRIPTS, SERVICES, running, service, stop

pytestmark = pytest.mark.image

IMAGE_USER = "10001:10001"
ENTRYPOINT = ["/usr/bin/tini", "--"]


@pytest.fixture(scope="module")
def image() -> str:
    name = os.environ.get("HOSS_IMAGE") or images.default_image()
    if shutil.which("buildah") is None:
        pytest.fail("buildah is not installed: `make image-test` (or `make image`) installs it", pytrace=False)
    if not images.image_exists(name):
        images.build(name, refresh_base=False, progress=print)
    return name


def in_image(container: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``argv`` run in ``container`` through the image's entrypoint, as its user."""
    return subprocess.run(images.run_argv(container, [*ENTRYPOINT, *argv]), capture_output=True, text=True,
                          timeout=120, check=False)


def test_the_image_runs_debian_python_as_its_own_user_through_tini(image: str) -> None:
    assert images.image_config(image, "User") == IMAGE_USER
    assert images.image_config(image, "Entrypoint") == f"[{' '.join(ENTRYPOINT)}]"
    with images.working_container(image) as container:
        who = in_image(container, "id", "-u")
        assert (who.returncode, who.stdout.strip()) == (0, "10001")
        python = in_image(container, "python", "-c", "import sys, hoss; print(sys.version_info[:2], hoss.__file__)")
        assert python.returncode == 0, python.stderr
        assert python.stdout.split(") ")[0] == "(3, 11"
        assert python.stdout.split(") ")[1].strip().startswith("/opt/hoss/lib/python3.11/site-packages/hoss/")
        debian = in_image(container, "cat", "/etc/debian_version")
        assert debian.stdout.startswith("12."), "the base is not Debian bookworm"
        apart = in_image(container, "python", "-c", "import importlib.util as u; "
                         "print([m for m in ('dev', 'bench', 'tests', 'pip') if u.find_spec(m)])")
        assert apart.stdout.strip() == "[]", "dev tools, tests or a package installer are in the image"


def test_every_console_script_answers_help_in_the_image(image: str) -> None:
    with images.working_container(image) as container:
        for script in sorted(SCRIPTS):
            done = in_image(container, script, "--help")
            assert done.returncode == 0, f"{script} --help failed in the image:\n{done.stderr[-3000:]}"
            assert done.stdout.startswith(f"usage: {script}"), done.stdout[:200]


def descendant(pid: int, name: str) -> int:
    """The process named ``name`` (its /proc comm) among ``pid``'s descendants."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += [child for child in children if _comm(child) == name]
        frontier = children
    if len(found) != 1:
        pytest.fail(f"expected one {name} under pid {pid}, found {found}", pytrace=False)
    return found[0]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def credentials_for_the_image_user(plane: LocalPlane, copies: Path) -> list[tuple[Path, Path]]:
    """The plane's kubeconfigs and certificates (copied, owned by the image's user) and the plane's policies and
    routing files, as read-only mounts at the paths the command lines name."""
    uid, gid = (int(part) for part in IMAGE_USER.split(":"))
    volumes: list[tuple[Path, Path]] = []
    for directory in (plane.files.kubeconfig_dir, plane.files.pki_dir):
        copy = copies / directory.name
        shutil.copytree(directory, copy)
        for path in (copy, *copy.rglob("*")):
            os.chown(path, uid, gid)
        volumes.append((copy, directory))
    return [*volumes, (POLICIES_FILE, POLICIES_FILE), (ROUTING_FILE, ROUTING_FILE)]


async def test_each_service_starts_inside_the_image_against_the_plane_and_stops_on_sigterm(
        image: str, plane: LocalPlane, tmp_path: Path) -> None:
    services = [service(plane, script, name=f"{script}-image") for script in SERVICES]
    volumes = credentials_for_the_image_user(plane, tmp_path / "credentials")
    with contextlib.ExitStack() as stack:
        containers = {script: stack.enter_context(images.working_container(image)) for script in SERVICES}

        def in_its_container(script: str, env: dict[str, str]) -> list[str]:
            # Without a PID namespace (chroot isolation) tini is not PID 1: as a subreaper it still reaps orphans.
            return images.run_argv(containers[script], [*ENTRYPOINT, script], env={**env, "TINI_SUBREAPER": "1"},
                                   volumes=volumes)

        logs = tmp_path / "logs"
        logs.mkdir()
        async with running(plane, services, launcher=in_its_container, log_dir=logs, suffix="image") as started:
            # The runtime signals the container's first process, tini, which passes SIGTERM on to the service (a
            # signal to `buildah run` itself would kill the container instead).
            codes = {each.service.script: stop(each, pid=descendant(each.popen.pid, "tini")) for each in started}
    assert codes == dict.fromkeys(SERVICES, 0)
