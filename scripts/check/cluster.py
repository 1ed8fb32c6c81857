"""The cluster under check: N broker processes, each in its own network namespace and, when
disk faults are on, with its data on a file system of its own (`Disk`).

Every node gets a namespace with one veth into a switch namespace that holds a bridge; the
host (where the clients run) joins the same bridge through one more veth. So all nodes and
the clients share one subnet, nodes can use the same ports on their own addresses, and a
network fault is a set of iptables rules inside a node's namespace that drops what one node
sends to or hears from another. Clients always reach every node: the faults are between
brokers, as Jepsen's partitions are between servers.

Nothing outside the namespaces this module creates is touched, except the host end of its
own veth. `teardown` removes everything (deleting a namespace deletes its interfaces).
"""

import fcntl
import gc
import os
import signal
import subprocess
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient

from check.wire import answers_api_versions

REPO_ROOT = Path(__file__).resolve().parents[2]
KAFKA_PORT = 9092
RAFT_PORT = 9093  # ferrolog's shard s listens on RAFT_PORT + s; Apache Kafka's controller
READY_TIMEOUT_S = 180


def run(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=30)


class Network:
    """The namespaces, the bridge and the fault rules."""

    def __init__(self, nodes):
        tag, self.lock = claim_tag()
        self.prefix = f"fc{tag}"
        self.subnet = f"10.211.{tag}"
        self.switch = f"{self.prefix}-sw"
        self.host_ip = f"{self.subnet}.1"
        self.nodes = list(nodes)
        self.blocked = set()  # (receiver, sender): receiver drops what sender sends it

    def ns(self, node):
        return f"{self.prefix}-n{node}"

    def ip_of(self, node):
        return f"{self.subnet}.{10 + node}"

    def create(self):
        self.teardown()
        run("ip", "netns", "add", self.switch)
        sw = ("ip", "netns", "exec", self.switch)
        run(*sw, "ip", "link", "add", "br0", "type", "bridge")
        run(*sw, "ip", "link", "set", "br0", "up")
        run(*sw, "ip", "link", "set", "lo", "up")
        # The host's own port into the switch.
        host_if, peer = f"{self.prefix}h", f"{self.prefix}hs"
        run("ip", "link", "add", host_if, "type", "veth", "peer", "name", peer)
        run("ip", "link", "set", peer, "netns", self.switch)
        run(*sw, "ip", "link", "set", peer, "master", "br0", "up")
        run("ip", "addr", "add", f"{self.host_ip}/24", "dev", host_if)
        run("ip", "link", "set", host_if, "up")
        for n in self.nodes:
            ns, inner, outer = self.ns(n), f"{self.prefix}n{n}", f"{self.prefix}s{n}"
            run("ip", "netns", "add", ns)
            run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            run("ip", "link", "set", outer, "netns", self.switch)
            run(*sw, "ip", "link", "set", outer, "master", "br0", "up")
            run("ip", "link", "set", inner, "netns", ns)
            inside = ("ip", "netns", "exec", ns)
            run(*inside, "ip", "addr", "add", f"{self.ip_of(n)}/24", "dev", inner)
            run(*inside, "ip", "link", "set", inner, "up")
            run(*inside, "ip", "link", "set", "lo", "up")

    def teardown(self):
        """Also kills what still runs inside the namespaces, such as the brokers of an earlier
        run with this tag that was itself killed (`ip netns del` only removes the name)."""
        run("ip", "link", "del", f"{self.prefix}h", check=False)
        for n in self.nodes:
            pids = run("ip", "netns", "pids", self.ns(n), check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            run("ip", "netns", "del", self.ns(n), check=False)
        run("ip", "netns", "del", self.switch, check=False)

    def iptables(self, node, *args):
        return run("ip", "netns", "exec", self.ns(node), "iptables", "-w", "5", *args)

    def block(self, receiver, sender):
        """`receiver` drops every packet from `sender`: with the rule both ways, no TCP
        connection between them forms or carries anything."""
        if (receiver, sender) not in self.blocked:
            self.iptables(receiver, "-A", "INPUT", "-s", self.ip_of(sender), "-j", "DROP")
            self.blocked.add((receiver, sender))

    def deafen(self, receiver, sender):
        """`receiver` drops the TCP segments from `sender` that carry data, and nothing else:
        connections still form and `sender`'s own data is still acknowledged, so `sender`
        hears `receiver` while `receiver` hears nothing from it. (Dropping every packet one
        way would stall TCP both ways: a one-way cut has to keep the acknowledgements.)
        Acknowledgements with SACK blocks are longer than 52 bytes and dropped too, which only
        slows the direction that still works."""
        if (receiver, sender) not in self.blocked:
            # 52 bytes: an IP header and a TCP header with timestamps, no payload.
            self.iptables(receiver, "-A", "INPUT", "-s", self.ip_of(sender), "-p", "tcp", "--tcp-flags", "SYN", "NONE",
                          "-m", "length", "--length", "53:65535", "-j", "DROP")  # fmt: skip
            self.blocked.add((receiver, sender))

    def heal(self):
        for n in self.nodes:
            self.iptables(n, "-F", "INPUT")
            rules = self.iptables(n, "-S", "INPUT").stdout.split("\n")
            assert not [r for r in rules if r.startswith("-A")], f"rules left in node {n}'s namespace: {rules}"
        self.blocked.clear()


class Disk:
    """A node's data on an ext4 file system of its own (a sparse image on a loop device,
    mounted with errors=remount-ro), which the nemesis can break:

    - `fail`: ext4's trigger_fs_error, the kernel's own path for a failed disk: it aborts
      the journal and turns the file system read-only, so every later write and fsync of
      the broker fails (EROFS), and nothing written after the abort reaches the disk;
    - `fill`: a ballast file takes all free space (ENOSPC).

    `repair` (the broker stopped first) unmounts it, has e2fsck replay the journal and clear
    the error, and mounts it again without the ballast."""

    SIZE = 8 << 30

    def __init__(self, image, mountpoint):
        self.image, self.mountpoint = image, mountpoint
        self.ballast = mountpoint / "ballast"
        self.broken = False

    def create(self):
        with open(self.image, "wb") as f:
            f.truncate(self.SIZE)
        run("mkfs.ext4", "-q", "-F", "-m", "0", str(self.image))  # no blocks kept for root
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.mount()

    def mount(self):
        run("mount", "-o", "loop,errors=remount-ro", str(self.image), str(self.mountpoint))

    def device(self):
        """The loop device's name (loopN), as /sys/fs/ext4 knows it."""
        return Path(run("findmnt", "-n", "-o", "SOURCE", str(self.mountpoint)).stdout.strip()).name

    def fail(self):
        self.broken = True
        Path(f"/sys/fs/ext4/{self.device()}/trigger_fs_error").write_text("ferrolog-check: disk-error fault\n")

    def fill(self):
        """ferrolog writes on into the space it preallocated for its segments, so a full
        disk shows first where it needs new space (a new segment, a small file)."""
        self.broken = True
        st = os.statvfs(self.mountpoint)
        run("fallocate", "-l", str(st.f_bfree * st.f_frsize), str(self.ballast), check=False)

    def repair(self):
        if os.path.ismount(self.mountpoint):  # not if an earlier repair got that far
            run("umount", str(self.mountpoint))
        # Every broker's `ip netns exec` has its own copy of the mounts; the unmount reaches
        # them through the shared mount the cluster put below (`Cluster.start`). Until the
        # loop device is let go, the file system is still mounted somewhere: no e2fsck then.
        deadline = time.monotonic() + 10
        while run("losetup", "-j", str(self.image)).stdout.strip():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.image} is still in use after its unmount")
            time.sleep(0.1)
        # Bits 1 and 2: errors corrected (a reboot advised); any other bit is a file system
        # e2fsck could not mend, or its own failure.
        fsck = subprocess.run(["e2fsck", "-f", "-y", str(self.image)], capture_output=True, text=True, timeout=300)
        if fsck.returncode & ~3:
            raise RuntimeError(f"e2fsck {self.image}: exit {fsck.returncode}: {fsck.stdout[-500:]}")
        self.mount()
        self.ballast.unlink(missing_ok=True)
        self.broken = False

    def unmount(self):
        """At the end: what it holds stays in the image (mount -o loop IMAGE DIR to look)."""
        run("umount", str(self.mountpoint), check=False)


class Node:
    """One broker process: ferrolog, or Apache Kafka through scripts/start-apache-kafka.sh."""

    def __init__(self, node_id, cluster):
        self.id = node_id
        self.cluster = cluster
        self.dir = cluster.workdir / f"node-{node_id}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "broker.log"
        # The data directory is a folder of the disk's root, which holds lost+found (Apache
        # Kafka refuses a log directory with a folder that is not a partition's).
        self.disk = Disk(cluster.workdir / f"node-{node_id}.img", self.dir / "disk") if cluster.disks else None
        self.data = (self.dir / "disk" if cluster.disks else self.dir) / "data"
        # A broker may stop by itself while its disk is broken (Apache Kafka halts when its
        # only log directory fails): the nemesis sets this for the fault's length.
        self.may_exit = False
        self.host = cluster.net.ip_of(node_id)
        self.bootstrap = f"{self.host}:{KAFKA_PORT}"
        self.proc = None
        self.paused = False
        self.starts = 0

    def command(self):
        c = self.cluster
        voters = ",".join(f"{n}@{c.net.ip_of(n)}:{RAFT_PORT}" for n in c.node_ids)
        if c.target == "ferrolog":
            listener = f"PLAINTEXT://{self.host}:{KAFKA_PORT}"
            cmd = [str(c.binary), "start", "--cores", str(c.cores)]
            configs = {
                "node.id": self.id,
                "controller.quorum.voters": voters,
                "listeners": listener,
                "advertised.listeners": listener,
                "log.dirs": self.data,
                **c.configs,
            }
            for k, v in configs.items():
                cmd += ["--override", f"{k}={v}"]
            return cmd, {"RUST_BACKTRACE": "1"}
        script = REPO_ROOT / "scripts" / "start-apache-kafka.sh"
        env = {
            "FOREGROUND": "1", "KAFKA_HOST": self.host, "CONTROLLER_PORT": str(RAFT_PORT),
            "KAFKA_VOTERS": voters, "KAFKA_NODE_ID": str(self.id), "KAFKA_CLUSTER_ID": c.cluster_id,
        }  # fmt: skip
        extra = [f"{k}={v}" for k, v in c.configs.items()]
        return ["bash", str(script), str(KAFKA_PORT), str(self.data), *extra], env

    def launch(self):
        assert self.proc is None, f"node {self.id} already running"
        cmd, env = self.command()
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start #{self.starts}: {' '.join(cmd)}\n".encode())
            log.flush()
            # `ip netns exec` execs the command, so the pid is the broker's own (kill -9 hits it).
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", self.cluster.net.ns(self.id), *cmd],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=dict(os.environ, **env), start_new_session=True,
            )  # fmt: skip
        self.paused = False

    def wait_ready(self, timeout_s=READY_TIMEOUT_S):
        deadline = time.monotonic() + timeout_s
        while not answers_api_versions(self.host, KAFKA_PORT):
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"node {self.id} exited during start-up; see {self.log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {self.id} not ready on {self.bootstrap} after {timeout_s} s")
            time.sleep(0.2)

    def signal(self, sig):
        """To the broker and anything it started (its own session and process group)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def kill9(self):
        if self.proc is None:
            return
        self.signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.proc = None
        self.paused = False

    def stop(self):
        """SIGTERM, SIGKILL after 30 s. Returns the exit status when the shutdown was not
        clean (a status other than 0 or SIGTERM's), else None."""
        if self.proc is None:
            return None
        if self.paused:
            self.resume()
        self.proc.send_signal(signal.SIGTERM)
        try:
            status = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait()
            status = "no exit 30 s after SIGTERM"
        self.proc = None
        # The JVM exits with 128 + 15 after its shutdown hooks.
        return None if status in (0, -signal.SIGTERM, 128 + signal.SIGTERM) else status

    def pause(self):
        self.signal(signal.SIGSTOP)
        self.paused = self.proc is not None

    def resume(self):
        self.signal(signal.SIGCONT)
        self.paused = False

    def storage_error_logged(self):
        """Whether the tail of the node's log tells of a failed or full disk."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - (64 << 10)))
                tail = f.read().decode(errors="replace")
        except OSError:
            return False
        return any(s in tail for s in ("Read-only file system", "No space left on device", "KafkaStorageException"))

    def exited(self):
        """The exit status of a process that died by itself (not killed by the nemesis)."""
        return None if self.proc is None else self.proc.poll()


def raise_memlock():
    """glommio's io_uring rings and Direct I/O buffers are locked memory. Raised once in the
    harness itself, which the brokers inherit: a pre-exec hook would run Python in a child
    forked while client threads run, which can deadlock."""
    import resource

    try:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (ValueError, OSError):
        pass


def claim_tag():
    """A network tag (1-250) no other ferrolog-check run on this machine holds, with the lock
    that keeps it: names and subnet derive from it."""
    for tag in range(1, 251):
        f = open(f"/run/ferrolog-check-{tag}.lock", "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return tag, f
        except BlockingIOError:
            f.close()
    raise RuntimeError("every ferrolog-check network tag is taken")


class Cluster:
    def __init__(self, target, workdir, size=3, binary=None, cores=2, configs=None, disks=False):
        self.target = target
        self.disks = disks
        self.workdir = Path(workdir)
        self.node_ids = list(range(1, size + 1))
        self.binary = binary
        self.cores = cores
        self.configs = dict(configs or {})
        # Apache Kafka: every node formats its storage with the same cluster id.
        self.cluster_id = "ZmVycm9sb2ctY2hlY2stMQ"
        self.net = Network(self.node_ids)
        self._admin = None
        self.nodes = {n: Node(n, self) for n in self.node_ids}

    def bootstrap(self):
        return ",".join(n.bootstrap for n in self.nodes.values())

    def admin(self):
        """One admin client for the whole run (librdkafka handles are thread-safe), rather
        than a new one, with its own connections, for every metadata poll."""
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap()})
        return self._admin

    def all_led(self, topic, partitions):
        """Every partition of `topic` has a leader and every replica in its ISR."""
        md = self.admin().list_topics(topic, timeout=5)
        parts = md.topics[topic].partitions
        size = len(self.node_ids)
        return len(parts) == partitions and all(p.leader >= 0 and len(p.isrs) == size for p in parts.values())

    def start(self):
        self.net.create()
        if self.disks:
            # A shared mount over the work directory: the disks mounted below it propagate
            # (and so do their unmounts) into the copies `ip netns exec` makes for brokers.
            run("mount", "--bind", str(self.workdir), str(self.workdir))
            run("mount", "--make-rshared", str(self.workdir))
            for n in self.nodes.values():
                n.disk.create()
        for n in self.nodes.values():  # all at once: each waits for a controller quorum
            n.launch()
        for n in self.nodes.values():
            n.wait_ready()

    def teardown(self):
        # The admin client first: alive, it would keep reconnecting to the nodes' addresses,
        # and once the namespaces are gone those route out of this machine.
        self._admin = None
        gc.collect()
        for n in self.nodes.values():
            try:
                n.kill9()
            except subprocess.TimeoutExpired:
                pass
            if n.disk is not None:
                n.disk.unmount()
        if self.disks:
            run("umount", str(self.workdir), check=False)
        self.net.teardown()
