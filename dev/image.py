"""``python -m dev image build``: hoss's container image (deploy/Containerfile), built for real without pulling a
base image: Debian's package mirror and PyPI are all it needs.

mmdebstrap makes a Debian bookworm root filesystem from Debian's packages (minbase; documentation, manual pages
and translations left out, as Debian's slim image does), buildah imports it as `BASE_IMAGE` and builds the
Containerfile on it with ``BASE`` set to it. Builds and runs use buildah's chroot isolation: no OCI runtime, so
no cgroup setup is needed (crun refuses a host whose cgroups are hybrid, v1 and v2 at once) and it works inside
another container too. The base is made again once it is older than `BASE_MAX_AGE_DAYS`, so that Debian's
security updates reach the image; the Containerfile's apt-get takes the current packages on top of it.

The images live in buildah's storage (containers-storage), outside the repository; ``buildah push`` (or
``podman push``) sends them to a registry.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONTAINERFILE = REPO / "deploy" / "Containerfile"
SUITE = "bookworm"
SOURCES = (
    f"deb http://deb.debian.org/debian {SUITE} main",
    f"deb http://deb.debian.org/debian {SUITE}-updates main",
    f"deb http://deb.debian.org/debian-security {SUITE}-security main",
)
"""The base's apt sources (and so the image's): Debian's own mirrors, security updates included."""
BASE_IMAGE = f"localhost/hoss-base:debian-{SUITE}"
BASE_MAX_AGE_DAYS = 7.0
BASE_MADE_LABEL = "io.hoss.base.made"
"""The label on the base image holding when it was made (Unix seconds)."""
SLIM_DPKG_OPTIONS = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
)
"""What Debian's slim images leave out; kept in the base's dpkg configuration, so later installs leave it out too."""
ISOLATION = ("--isolation", "chroot")


class ImageError(RuntimeError):
    """A step of making or running the image failed; the message says which and why."""


def default_image() -> str:
    """ghcr.io/hoss-sched/hoss:<the version in pyproject.toml>, the name the manifests in deploy/ use."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return f"ghcr.io/hoss-sched/hoss:{project['version']}"


def mmdebstrap_argv(tarball: Path) -> list[str]:
    """mmdebstrap making the base root filesystem as a tarball."""
    return [
        "mmdebstrap", "--variant=minbase", "--format=tar",
        *(f"--dpkgopt={option}" for option in SLIM_DPKG_OPTIONS),
        "--aptopt=Acquire::Languages \"none\"",
        SUITE, str(tarball), *SOURCES,
    ]


def build_argv(image: str, *, base: str, pip_ca: Path | None = None) -> list[str]:
    """buildah building deploy/Containerfile from the repository root on ``base``, as ``image``. Intermediate
    layers are kept, so a rebuild redoes only what changed, and no container is left behind when it fails;
    ``--pull=never``: the base is local. ``pip_ca``, the CA bundle pip trusts, goes in as the secret ``pip-ca``
    (see the Containerfile)."""
    return [
        "buildah", "build", *ISOLATION, "--network", "host", "--layers", "--force-rm", "--pull=never",
        *([f"--secret=id=pip-ca,src={pip_ca}"] if pip_ca else []),
        "--build-arg", f"BASE={base}", "--file", str(CONTAINERFILE), "--tag", image, str(REPO),
    ]


def pip_ca_bundle(environ: Mapping[str, str]) -> Path | None:
    """The CA bundle this machine's pip trusts when it is told one (``PIP_CERT``, else ``REQUESTS_CA_BUNDLE``,
    else ``SSL_CERT_FILE``): a machine that reaches PyPI through a TLS proxy trusts the proxy's CA that way, and
    the build's pip must too."""
    for variable in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        bundle = environ.get(variable)
        if bundle and Path(bundle).is_file():
            return Path(bundle).resolve()
    return None


def run_argv(container: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
             volumes: Sequence[tuple[Path, Path]] = ()) -> list[str]:
    """``argv`` run in ``container`` (a buildah working container of the image) as the image's user, on the
    host's network; ``volumes`` (host, container) are mounted read-only."""
    return [
        "buildah", "run", *ISOLATION, "--network", "host",
        *(f"--env={name}={value}" for name, value in (env or {}).items()),
        *(f"--volume={host}:{inside}:ro" for host, inside in volumes),
        container, "--", *argv,
    ]


def _buildah(*args: str, what: str) -> str:
    """Run ``buildah args`` (output captured); its stdout, stripped, or ImageError naming ``what``."""
    if shutil.which("buildah") is None:
        raise ImageError("buildah is not installed: `make image` installs it (Debian package buildah)")
    done = subprocess.run(["buildah", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ImageError(f"{what} failed (buildah {' '.join(args)}): {done.stderr.strip()[-3000:]}")
    return done.stdout.strip()


def _streamed(argv: Sequence[str], *, what: str) -> None:
    """Run ``argv`` with its output on this process's stderr (a build's progress); ImageError when it fails."""
    if shutil.which(argv[0]) is None:
        raise ImageError(f"{argv[0]} is not installed: `make image` installs it (Debian package {argv[0]})")
    done = subprocess.run(list(argv), stdout=sys.stderr, stderr=sys.stderr, check=False)
    if done.returncode != 0:
        raise ImageError(f"{what} failed with code {done.returncode} ({' '.join(argv)}); its output is above")


def image_exists(image: str) -> bool:
    done = subprocess.run(["buildah", "inspect", "--type", "image", image], capture_output=True, check=False)
    return done.returncode == 0


def base_age_days(base: str = BASE_IMAGE) -> float | None:
    """How old the base image is, or None when there is none (or it carries no label saying when it was made)."""
    if not image_exists(base):
        return None
    made = _buildah("inspect", "--type", "image", "--format",
                    f'{{{{index .OCIv1.Config.Labels "{BASE_MADE_LABEL}"}}}}', base, what="reading the base's age")
    if not made.isdigit():
        return None
    return (time.time() - int(made)) / 86400


def make_base(*, progress: Callable[[str], None]) -> None:
    """Make `BASE_IMAGE` from Debian's packages: mmdebstrap's tarball, added to an empty image."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hoss" / "image"
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        tarball = Path(scratch) / f"debian-{SUITE}.tar"
        progress(f"making the base root filesystem with mmdebstrap (Debian {SUITE} minbase)")
        started = time.monotonic()
        _streamed(mmdebstrap_argv(tarball), what="mmdebstrap")
        progress(f"root filesystem made in {time.monotonic() - started:.0f}s ({tarball.stat().st_size >> 20} MiB); "
                 f"importing it as {BASE_IMAGE}")
        container = _buildah("from", "scratch", what="an empty working container")
        try:
            _buildah("add", container, str(tarball), "/", what="adding the root filesystem")
            _buildah("config", "--cmd", "/bin/bash", "--env",
                     "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                     "--label", f"{BASE_MADE_LABEL}={int(time.time())}", container, what="configuring the base")
            _buildah("commit", "--quiet", container, BASE_IMAGE, what="committing the base")
        finally:
            _buildah("rm", container, what="removing the base's working container")


def build(image: str, *, refresh_base: bool, progress: Callable[[str], None]) -> None:
    """Build ``image`` from deploy/Containerfile on a base from Debian's packages (made first when missing, stale
    or ``refresh_base``)."""
    age = base_age_days()
    if refresh_base or age is None or age > BASE_MAX_AGE_DAYS:
        make_base(progress=progress)
    else:
        progress(f"reusing the base {BASE_IMAGE} ({age:.1f} days old; made again after {BASE_MAX_AGE_DAYS:.0f})")
    progress(f"building {image} with buildah from {CONTAINERFILE.relative_to(REPO)}")
    started = time.monotonic()
    _streamed(build_argv(image, base=BASE_IMAGE, pip_ca=pip_ca_bundle(os.environ)), what="buildah build")
    size = _buildah("images", "--format", "{{.Size}}", image, what="reading the image's size")
    progress(f"built {image} in {time.monotonic() - started:.0f}s ({size})")


@contextlib.contextmanager
def working_container(image: str) -> Iterator[str]:
    """A buildah working container of ``image`` (its name), removed afterwards."""
    container = _buildah("from", "--pull=never", image, what=f"a working container of {image}")
    try:
        yield container
    finally:
        _buildah("rm", container, what=f"removing the working container {container}")


def image_config(image: str, field: str) -> str:
    """A field of the image's OCI configuration, as buildah's Go template prints it (e.g. ``User``)."""
    return _buildah("inspect", "--type", "image", "--format", f"{{{{.OCIv1.Config.{field}}}}}", image,
                    what=f"reading {field} of {image}")
