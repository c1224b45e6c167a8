"""The container backend's command line: limits, binds, environment, network and identity, without a runtime."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gyre.config import SandboxConfig
from gyre.errors import SandboxError
from gyre.sandbox import ContainerSandbox, container
from gyre.sandbox.container import Identity, Runtime, container_argv
from gyre.tasks.formats import load_task

PODMAN = Runtime("podman", "/usr/bin/podman", ("--runtime", "runc"))
DOCKER = Runtime("docker", "/usr/bin/docker")
CFG = SandboxConfig(
    image="localhost/tools:1", memory_mib=256, max_processes=64, cpu_time_s=30, open_files=1024
)
ROOT_PODMAN = Identity(200_015_872, uidmap=True)


def argv(
    runtime: Runtime = PODMAN, cfg: SandboxConfig = CFG, who: Identity = ROOT_PODMAN, **kw: object
) -> list[str]:
    args: dict[str, object] = {
        "name": "gyre-abc-0", "label": "abc", "workspace": "/host/ws", "tmp": "/host/tmp",
        "argv": ["bash", "-c", "echo hi"], "env": {}, "cwd": None, "timeout_s": 10.0,
    } | kw  # fmt: skip
    return container_argv(runtime, cfg, who, **args)  # type: ignore[arg-type]


def test_a_command_runs_in_a_fresh_read_only_container_without_network_or_privileges() -> None:
    out = argv()
    assert out[:4] == ["/usr/bin/podman", "--runtime", "runc", "run"]
    for flag in ("--rm", "-i", "--pull=never", "--init", "--read-only", "--read-only-tmpfs=false"):
        assert flag in out
    assert out[out.index("--network") + 1] == "none" and out[out.index("--cap-drop") + 1] == "ALL"
    assert out[out.index("--security-opt") + 1] == "no-new-privileges"
    assert (
        out[out.index("--label") + 1] == "gyre.sandbox=abc" and out[out.index("--name") + 1] == "gyre-abc-0"
    )
    # the command is the entrypoint (the image's own is not run), then its arguments after the image
    assert out[out.index("--entrypoint") + 1 :] == [
        json.dumps(["bash"]),
        "localhost/tools:1",
        "-c",
        "echo hi",
    ]
    shared = argv(cfg=SandboxConfig(image="i", network=True))  # network = true: the host's, as bubblewrap's
    assert shared[shared.index("--network") + 1] == "host"


def test_limits_are_the_sandbox_configs() -> None:
    out = argv()
    assert {"--memory=256m", "--memory-swap=256m", "--shm-size=256m", "--pids-limit=64"} <= set(out)
    ulimits = {a.split("=", 1)[1] for a in out if a.startswith("--ulimit=")}
    assert ulimits == {"cpu=30:35", f"fsize={1024 << 20}", "nofile=1024", "core=0", "nproc=64"}
    assert "--timeout=40" in out  # podman's own backstop: the command's timeout and 30 s
    assert not any(a.startswith("--cpus") for a in out)
    assert "--cpus=1.5" in argv(cfg=SandboxConfig(image="i", container_cpus=1.5))


def test_identity_never_host_root() -> None:
    out = argv()
    assert "--uidmap=0:200015872:65536" in out and "--gidmap=0:200015872:65536" in out and "--user" not in out
    rootless = argv(
        who=Identity(None)
    )  # podman's container root is the invoking user: nproc would count theirs
    assert (
        not any(a.startswith(("--uidmap", "--ulimit=nproc")) for a in rootless) and "--user" not in rootless
    )
    docker = argv(DOCKER, who=Identity(300_000_000, user="300000000:300000000"))
    assert docker[docker.index("--user") + 1] == "300000000:300000000"
    assert not any(a.startswith(("--uidmap", "--timeout", "--read-only-tmpfs")) for a in docker)
    assert docker[docker.index("--entrypoint") + 1] == "bash"  # Docker takes the string as it is


def test_binds_environment_and_working_directory() -> None:
    out = argv(
        binds=[("/host/socket", "/run/gyre", False), ("/host/logs", "/logs", True)],
        env={"MY_VAR": "x y", "HOME": "/elsewhere"},
        cwd="sub/../dir",
    )
    volumes = [out[i + 1] for i, a in enumerate(out) if a == "--volume"]
    assert volumes == [
        "/host/ws:/workspace:rw", "/host/tmp:/tmp:rw", "/host/socket:/run/gyre:ro", "/host/logs:/logs:rw"
    ]  # fmt: skip
    env = [out[i + 1] for i, a in enumerate(out) if a == "--env"]
    assert env == ["HOME=/elsewhere", "TMPDIR=/tmp", "TERM=dumb", "MY_VAR=x y"]  # nothing of the driver's
    assert out[out.index("--workdir") + 1] == "/workspace/dir"
    tmp = argv(cwd="/tmp")
    assert tmp[tmp.index("--workdir") + 1] == "/tmp"
    with pytest.raises(SandboxError, match="':'"):
        argv(binds=[("/host/a:b", "/x", False)])
    with pytest.raises(SandboxError, match="not a container image name"):
        argv(cfg=SandboxConfig(image="--privileged"))


def test_a_container_sandbox_needs_an_image() -> None:
    with pytest.raises(SandboxError, match="needs an image"):
        ContainerSandbox(SandboxConfig())


def test_harbor_tasks_naming_an_image_record_it_and_say_why_they_cannot_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = Path(__file__).parents[2] / "unit" / "tasks" / "data"
    monkeypatch.setattr(container, "_find", lambda choice: "podman: not installed; docker: not installed")
    task = load_task(data / "harbor-image")
    assert task.image == "ghcr.io/example/hello:latest"
    assert task.unsupported is not None and "no container runtime (podman or Docker)" in task.unsupported
    assert "ghcr.io/example/hello:latest" in task.unsupported and "podman: not installed" in task.unsupported
    monkeypatch.setattr(container, "_find", lambda choice: PODMAN)
    monkeypatch.setattr(container, "_image_missing", lambda runtime, image: None)
    ready = load_task(data / "harbor-image")
    assert ready.unsupported is None and ready.image == "ghcr.io/example/hello:latest"
    assert load_task(data / "harbor-hello").image is None
