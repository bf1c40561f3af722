"""The host layer: dpkg whole, the driver branch held and running, the GPU clock locked, the
kernel held where the owner says so, the container toolkit, the host hygiene the field learned.
Nothing here needs the fabric or another box."""

from pyinfra.api import deploy

from operations import debpkg, driver, gpuclock, hygiene, kernel, toolkit
from operations.asked import Question
from spark.plan import BoxPlan


def questions(box: BoxPlan) -> list[Question]:
    """Everything the stage reads of the box, which deploy.py says ahead (operations/asked.py)."""
    return [
        *debpkg.questions(),
        *driver.questions(),
        *gpuclock.questions(),
        *kernel.held_questions(box.kernel.hold),
        *toolkit.questions(),
        *hygiene.questions(),
    ]


@deploy("Host layer")
def host_layer(box: BoxPlan) -> None:
    # What an interrupted run left dpkg in the middle of is finished first: apt installs
    # nothing until it is. Then the driver, so that a box on another branch stops before
    # anything else changes.
    debpkg.completed(name="dpkg: nothing left half installed")
    driver.branch_held(
        name=f"Driver branch {box.driver.branch}: installed, held, apt pinned",
        branch=box.driver.branch,
        package=box.driver.package,
        version=box.driver.version,
    )
    driver.running(
        name=f"nvidia-smi reports a {box.driver.branch} driver", branch=box.driver.branch
    )
    lock = box.gpu_clock_lock
    gpuclock.clock_locked(
        name=f"GPU clock locked to {lock.min_mhz}-{lock.max_mhz} MHz at every boot"
        if lock
        else "GPU clock not locked",
        lock=(lock.min_mhz, lock.max_mhz) if lock else None,
        command=lock.command if lock else "",
    )
    kernel.held(
        name="Kernel held: metapackages held, apt pinned" if box.kernel.hold else "Kernel not held",
        packages=box.kernel.hold,
    )
    toolkit.repository(
        name="NVIDIA container toolkit apt repository",
        url=box.toolkit.repo_url,
        key_url=box.toolkit.key_url,
    )
    toolkit.installed(
        name=f"NVIDIA container toolkit {box.toolkit.version}", version=box.toolkit.version
    )
    # docker is restarted whenever the running daemon lacks the nvidia runtime.
    toolkit.docker_runtime(name="docker's nvidia runtime (nvidia-ctk), in the running daemon")
    hygiene.logind_keep_ipc(name="logind keeps IPC of logged-out users (RemoveIPC=no)")
    hygiene.sshd_oom_protected(name="sshd's listener out of the OOM killer's reach (-1000)")
