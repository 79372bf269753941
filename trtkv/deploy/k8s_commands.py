"""The commands the Kubernetes server containers run: the one-node server command (a keyed one under
bash, refusing an empty key), and for a LeaderWorkerSet the leader's launch (sshd, then mpirun over
every pod of the group once each sshd answers, or the Ray head then vLLM) and the workers' (sshd in
the foreground, or a Ray worker). The objects that run them are trtkv.deploy.k8s'."""

from __future__ import annotations

from trtkv.deploy import pods
from trtkv.deploy.launch import (
    REQUIRE_KEY,
    SSH_DIR,
    SSH_PORT,
    SSH_WAIT_S,
    Launch,
    dp_node_script,
    ray_head,
    ray_worker,
    shell_join,
)
from trtkv.deploy.sizing import Sizing

RAY_NODE_PORT = 6380  # the workers' raylet (--node-manager-port): their probes' port
# one host key for every pod of the deployment, from the Secret
SSH_HOST_KEY = f"{SSH_DIR}/ssh_host_ed25519_key"
# its line for the LWS pods' DNS names (the README's secret step)
SSH_KNOWN_HOSTS = f"{SSH_DIR}/known_hosts"
# sshd as the image's own non-root user (no privilege separation, no capabilities: it logs in that
# same user only)
SSHD = (
    f"/usr/sbin/sshd -e -p {SSH_PORT} -h {SSH_HOST_KEY} -o PidFile=/tmp/sshd.pid -o UsePAM=no "
    f"-o PermitRootLogin=no -o AuthorizedKeysFile={SSH_DIR}/authorized_keys -o StrictModes=no "
    "-o PasswordAuthentication=no -o KbdInteractiveAuthentication=no -o AllowTcpForwarding=no "
    "-o X11Forwarding=no -o PermitTunnel=no"
)
SSH_OPTIONS = (
    f"-p {SSH_PORT} -i {SSH_DIR}/id_ed25519 -o IdentitiesOnly=yes -o StrictHostKeyChecking=yes "
    f"-o UserKnownHostsFile={SSH_KNOWN_HOSTS} -o GlobalKnownHostsFile=/dev/null -o BatchMode=yes"
)
WORKER_HOSTS = (
    "NAME=${LWS_LEADER_ADDRESS%%.*}; DOMAIN=${LWS_LEADER_ADDRESS#*.}; "
    'HOSTS="$LWS_LEADER_ADDRESS:{slots}"; for i in $(seq 1 $((LWS_GROUP_SIZE - 1))); do '
    'HOSTS="$HOSTS,$NAME-$i.$DOMAIN:{slots}"; done; '
)
WAIT_SSH = (
    'for h in $(echo "$HOSTS" | tr , " "); do h=${h%:*}; n=0; '
    f"until (exec 3<>/dev/tcp/$h/{SSH_PORT}) 2>/dev/null; do n=$((n+1)); "
    f'[ $n -gt {SSH_WAIT_S // 5} ] && echo "no sshd on $h after {SSH_WAIT_S} s" >&2 && exit 1; '
    "sleep 5; done; "
    "done; "
)
# mpirun's own install (orted on the other pods) and the image's environment for every rank; FQDNs
# kept whole
MPI_PREFIX = 'MPI_HOME=$(dirname "$(dirname "$(command -v mpirun)")"); '
MPI_ARGS = [
    "--prefix",
    "\x00MPI_HOME",
    "-mca",
    "orte_keep_fqdn_hostnames",
    "1",
    "-x",
    "PATH",
    "-x",
    "LD_LIBRARY_PATH",
    "-x",
    "PYTHONPATH",
    "-x",
    "HOME",
    "-x",
    "TMPDIR",
    "-x",
    "USER",
]


def _keyed(launch: Launch) -> str:
    """The key from its Secret file, then the refusal to start without one."""
    return pods.key_from_file(launch) + REQUIRE_KEY if launch.keyed else ""


def leader_script(launch: Launch, sizing: Sizing) -> str:
    """bash on the leader pod: the MPI launch over every pod of the group, or the Ray head then
    vLLM."""
    if launch.ray_worker:
        return _keyed(launch) + ray_head(launch, "$LWS_GROUP_SIZE")
    if launch.dp_worker:
        return _keyed(launch) + dp_node_script(launch, '"$LWS_LEADER_ADDRESS"', "0", leader=True)
    mpirun = (
        launch.leader[:2]
        + ["-H", "\x00HOSTS", "-mca", "plm_rsh_args", SSH_OPTIONS, *MPI_ARGS]
        + launch.leader[2:]
    )
    cmd = shell_join(mpirun, {"\x00HOSTS": '"$HOSTS"', "\x00MPI_HOME": '"$MPI_HOME"'})
    return (
        _keyed(launch)
        + f"{SSHD} && "
        + WORKER_HOSTS.replace("{slots}", str(sizing.gpus_per_pod))
        + WAIT_SSH
        + MPI_PREFIX
        + f"exec {cmd}"
    )


def worker_script(launch: Launch) -> str:
    if launch.ray_worker:
        return ray_worker("$LWS_LEADER_ADDRESS", RAY_NODE_PORT)
    if launch.dp_worker:  # a headless node: its DP ranks from LWS's worker index
        return dp_node_script(launch, '"$LWS_LEADER_ADDRESS"', "LWS_WORKER_INDEX", leader=False)
    return SSHD.replace("/usr/sbin/sshd -e", "exec /usr/sbin/sshd -D -e")


def single_command(launch: Launch) -> list[str]:
    """The one-node server command; a keyed server under bash -c, which reads $TRTKV_API_KEY from
    the key's Secret file and refuses to start with an empty key (vLLM and Triton would then take
    any request)."""
    if not launch.keyed:
        return launch.single
    return ["bash", "-c", _keyed(launch) + "exec " + shell_join(launch.single)]
