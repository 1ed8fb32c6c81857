//! Three nodes in one process, each on its own thread and glommio executor, with real
//! segment files and real TCP on 127.0.0.1: partition groups elect leaders, replicate
//! batches to identical logs (same offsets, epochs and bytes on every node), fail over when
//! a leader's node dies, and bring the node back in step when it returns, also when the
//! entries it lacks were purged meanwhile (it takes a snapshot and starts its log at the
//! leader's offset).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrolog_io::batch::{self, BatchHeader};
use ferrolog_io::LogConfig;
use futures::channel::{mpsc, oneshot};
use futures::{SinkExt, StreamExt};
use openraft::async_runtime::watch::WatchReceiver;
use openraft::{AsyncRuntime, BasicNode, Config, Raft};

use crate::entry::test_batch;
use crate::network::{GroupRaft, Transport};
use crate::state_machine::PartitionStateMachine;
use crate::store::{LogStore, StoreView};
use crate::wire::GroupId;
use crate::GlommioRuntime;

const GROUPS: u64 = 4;

/// What the test asks of a node's executor.
enum Command {
    Initialize(BTreeMap<u64, BasicNode>),
    Leader(GroupId, oneshot::Sender<Option<u64>>),
    Write(GroupId, i32, oneshot::Sender<Result<u64, String>>),
    /// Last applied index and every stored batch.
    Dump(GroupId, oneshot::Sender<(Option<u64>, Vec<Stored>)>),
    /// Takes a snapshot through the last applied entry but two, and purges through it.
    Purge(GroupId, oneshot::Sender<()>),
    Stop,
}

/// A stored batch as a replica holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stored {
    base_offset: i64,
    last_offset: i64,
    epoch: i32,
    crc: u32,
    control: bool,
}

struct Node {
    commands: mpsc::Sender<Command>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Node {
    fn start(id: u64, port: u16, dir: PathBuf) -> Node {
        Node::start_with(id, port, dir, config())
    }

    fn start_with(id: u64, port: u16, dir: PathBuf, config: Arc<Config>) -> Node {
        let (tx, rx) = mpsc::channel(16);
        let thread = std::thread::spawn(move || {
            let mut rt = <GlommioRuntime as AsyncRuntime>::new(1);
            rt.block_on(run_node(id, port, dir, config, rx));
        });
        Node {
            commands: tx,
            thread: Some(thread),
        }
    }

    fn ask<T>(&mut self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> T {
        let (tx, rx) = oneshot::channel();
        futures::executor::block_on(async {
            self.commands.send(make(tx)).await.expect("node running");
            rx.await.expect("node answered")
        })
    }

    fn stop(&mut self) {
        let _ = futures::executor::block_on(self.commands.send(Command::Stop));
        if let Some(t) = self.thread.take() {
            t.join().expect("node thread");
        }
    }
}

fn config() -> Arc<Config> {
    let config = Config {
        cluster_name: "ferrolog-test".into(),
        heartbeat_interval: 100,
        election_timeout_min: 400,
        election_timeout_max: 800,
        ..Config::default()
    };
    Arc::new(config.validate().expect("valid raft config"))
}

async fn run_node(
    id: u64,
    port: u16,
    dir: PathBuf,
    config: Arc<Config>,
    mut commands: mpsc::Receiver<Command>,
) {
    let transport = Transport::new();
    let listener =
        glommio::net::TcpListener::bind(("127.0.0.1", port)).expect("bind the raft port");
    transport.serve(listener);
    let mut groups: BTreeMap<GroupId, (GroupRaft, Rc<ferrolog_io::Log>, StoreView)> =
        BTreeMap::new();
    for g in 0..GROUPS {
        let group = GroupId(g);
        let log_config = LogConfig {
            segment_bytes: 2048,
            preallocate_bytes: 4096,
            ..LogConfig::default()
        };
        let store = LogStore::open(
            &dir.join(format!("group-{g}")),
            log_config,
            Rc::new(|| 1_700_000_000_000),
        )
        .await
        .expect("open store");
        let (log, view) = (store.log().clone(), store.view());
        let sm = PartitionStateMachine::open(
            store.view(),
            Box::new(|_| {}),
            Box::new(|_| Default::default()),
        )
        .expect("open sm");
        let raft = Raft::new(id, config.clone(), transport.factory(group), store, sm)
            .await
            .expect("start raft");
        transport
            .register(group, raft.clone(), log.clone())
            .expect("distinct groups");
        assert!(
            transport
                .register(group, raft.clone(), log.clone())
                .is_err(),
            "a second registration of a group id is refused"
        );
        groups.insert(group, (raft, log, view));
    }
    while let Some(command) = commands.next().await {
        match command {
            Command::Initialize(members) => {
                for (raft, _, _) in groups.values() {
                    raft.initialize(members.clone()).await.expect("initialize");
                }
            }
            Command::Leader(g, reply) => {
                let _ = reply.send(groups[&g].0.metrics().borrow_watched().current_leader);
            }
            Command::Write(g, records, reply) => {
                let raft = groups[&g].0.clone();
                glommio::spawn_local(async move {
                    let result = raft.client_write(test_batch(records)).await;
                    let _ = reply.send(result.map(|r| r.log_id.index).map_err(|e| e.to_string()));
                })
                .detach();
            }
            Command::Dump(g, reply) => {
                let (raft, log, _) = &groups[&g];
                let applied = raft
                    .metrics()
                    .borrow_watched()
                    .last_applied
                    .map(|l| l.index);
                let mut batches = Vec::new();
                let mut offset = log.start_offset();
                while offset < log.durable_offset() {
                    let bytes = log
                        .read(offset, 1 << 20, i64::MAX, true)
                        .await
                        .expect("read");
                    let mut rest = &bytes[..];
                    while !rest.is_empty() {
                        let h: BatchHeader = batch::verify(rest).expect("valid batch");
                        batches.push(Stored {
                            base_offset: h.base_offset,
                            last_offset: h.last_offset(),
                            epoch: h.partition_leader_epoch,
                            crc: h.crc,
                            control: h.is_control(),
                        });
                        offset = h.next_offset();
                        rest = &rest[h.total_bytes()..];
                    }
                }
                let _ = reply.send((applied, batches));
            }
            Command::Purge(g, reply) => {
                let (raft, _, view) = groups[&g].clone();
                let wait = || raft.wait(Some(Duration::from_secs(20)));
                let applied = raft.metrics().borrow_watched().last_applied;
                let upto = applied.expect("something applied").index - 2;
                view.snapshot_through(upto);
                raft.trigger().snapshot().await.expect("snapshot");
                let snapshot = wait()
                    .metrics(|m| m.snapshot.is_some(), "snapshot")
                    .await
                    .expect("snapshot taken")
                    .snapshot;
                assert_eq!(snapshot.map(|s| s.index), Some(upto), "snapshot through");
                raft.trigger().purge_log(upto).await.expect("purge");
                wait()
                    .metrics(|m| m.purged.is_some_and(|p| p.index >= upto), "purge")
                    .await
                    .expect("purged");
                let _ = reply.send(());
            }
            Command::Stop => break,
        }
    }
    // The test's "kill": sockets close as at a process exit, with no Raft shutdown handshake.
    transport.shutdown();
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Node id -> the leader it sees for `g`, when all running nodes agree on one.
fn agreed_leader(nodes: &mut BTreeMap<u64, Node>, g: GroupId) -> Option<u64> {
    let seen: Vec<Option<u64>> = nodes
        .values_mut()
        .map(|n| n.ask(|r| Command::Leader(g, r)))
        .collect();
    let first = seen[0]?;
    (seen.iter().all(|s| *s == Some(first)) && nodes.contains_key(&first)).then_some(first)
}

/// Writes `n` batches of 1..=4 records to every group through its leader. A write the
/// node refuses because it no longer leads (ForwardToLeader: never appended) goes to the new
/// leader; any other failure fails the test.
fn write_batches(nodes: &mut BTreeMap<u64, Node>, n: i32) {
    for g in (0..GROUPS).map(GroupId) {
        for i in 0..n {
            let mut attempts = 0;
            loop {
                let leader = wait_for("a leader", || agreed_leader(nodes, g));
                let result = nodes
                    .get_mut(&leader)
                    .unwrap()
                    .ask(|r| Command::Write(g, 1 + i % 4, r));
                match result {
                    Ok(_) => break,
                    Err(e) if e.contains("forward request") && attempts < 100 => {
                        // The nodes' metrics may name a leader a moment before it takes writes.
                        attempts += 1;
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Err(e) => panic!("write to group {} via node {leader}: {e}", g.0),
                }
            }
        }
    }
}

/// Waits until every running node has applied the same entries, then checks their logs hold
/// the same batches at the same offsets; returns the number of data batches per group.
fn assert_logs_identical(nodes: &mut BTreeMap<u64, Node>) -> Vec<usize> {
    let mut data_batches = Vec::new();
    for g in (0..GROUPS).map(GroupId) {
        let dumps = wait_for("replicas in step", || {
            let dumps: Vec<_> = nodes
                .values_mut()
                .map(|n| n.ask(|r| Command::Dump(g, r)))
                .collect();
            let same = dumps.windows(2).all(|w| w[0] == w[1]);
            (same && dumps[0].0.is_some()).then_some(dumps)
        });
        let batches = &dumps[0].1;
        // Offsets are contiguous: each batch starts where the previous one ended.
        for w in batches.windows(2) {
            assert_eq!(
                w[0].last_offset + 1,
                w[1].base_offset,
                "offset gap in group {}",
                g.0
            );
            assert!(
                w[0].epoch <= w[1].epoch,
                "leader epochs go backwards in group {}",
                g.0
            );
        }
        data_batches.push(batches.iter().filter(|b| !b.control).count());
    }
    data_batches
}

/// Starts nodes 1-3 under `root` on free ports and has node 1 initialize every group.
fn start_cluster(root: &std::path::Path) -> (BTreeMap<u64, u16>, BTreeMap<u64, Node>) {
    start_cluster_with(root, config())
}

fn start_cluster_with(
    root: &std::path::Path,
    config: Arc<Config>,
) -> (BTreeMap<u64, u16>, BTreeMap<u64, Node>) {
    let _ = std::fs::remove_dir_all(root);
    let ports: BTreeMap<u64, u16> = (1..=3).map(|id| (id, free_port())).collect();
    let mut nodes: BTreeMap<u64, Node> = ports
        .iter()
        .map(|(&id, &port)| {
            let dir = root.join(format!("node-{id}"));
            (id, Node::start_with(id, port, dir, config.clone()))
        })
        .collect();
    let members: BTreeMap<u64, BasicNode> = ports
        .iter()
        .map(|(&id, &port)| (id, BasicNode::new(format!("127.0.0.1:{port}"))))
        .collect();
    nodes
        .get_mut(&1)
        .unwrap()
        .commands
        .try_send(Command::Initialize(members))
        .unwrap();
    (ports, nodes)
}

#[test]
fn three_nodes_replicate_fail_over_and_catch_up() {
    let root = std::env::temp_dir().join(format!("ferrolog-raft-cluster-{}", std::process::id()));
    let (ports, mut nodes) = start_cluster(&root);

    write_batches(&mut nodes, 20);
    let _ = assert_logs_identical(&mut nodes);

    // Kill the node leading group 0; another node takes over and writes go on.
    let victim = wait_for("a leader", || agreed_leader(&mut nodes, GroupId(0)));
    let mut dead = nodes.remove(&victim).unwrap();
    dead.stop();
    write_batches(&mut nodes, 10);
    let new_leader = wait_for("a new leader", || agreed_leader(&mut nodes, GroupId(0)));
    assert_ne!(new_leader, victim);

    // The node comes back on its old disk and port and catches up to identical logs.
    nodes.insert(
        victim,
        Node::start(victim, ports[&victim], root.join(format!("node-{victim}"))),
    );
    write_batches(&mut nodes, 5);
    let data = assert_logs_identical(&mut nodes);
    // Every acknowledged write is in every log exactly once (client_write does not retry).
    assert_eq!(data, vec![35; GROUPS as usize], "data batches per group");
    for (_, mut n) in nodes {
        n.stop();
    }
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_node_behind_the_purged_log_takes_a_snapshot() {
    let root = std::env::temp_dir().join(format!("ferrolog-raft-purge-{}", std::process::id()));
    let (ports, mut nodes) = start_cluster(&root);
    let start = |id: u64| Node::start(id, ports[&id], root.join(format!("node-{id}")));
    write_batches(&mut nodes, 20);
    let _ = assert_logs_identical(&mut nodes);

    // Node 3 misses 10 batches, and the others purge everything they applied.
    let mut away = nodes.remove(&3).unwrap();
    away.stop();
    write_batches(&mut nodes, 10);
    for g in (0..GROUPS).map(GroupId) {
        for n in nodes.values_mut() {
            n.ask(|r| Command::Purge(g, r));
        }
    }
    // It comes back with its old log: the leaders send snapshots, it restarts its logs at
    // their offsets, and the next batches land at the same offsets everywhere.
    nodes.insert(3, start(3));
    write_batches(&mut nodes, 5);
    let data = assert_logs_identical(&mut nodes);
    // The two entries kept past each purge, and the five new ones.
    assert!(
        data.iter().all(|&d| d >= 7),
        "kept and new batches in every log: {data:?}"
    );
    let dump = |nodes: &mut BTreeMap<u64, Node>| {
        nodes
            .get_mut(&3)
            .unwrap()
            .ask(|r| Command::Dump(GroupId(0), r))
    };
    let (_, before) = dump(&mut nodes);
    assert!(
        before[0].base_offset > 0,
        "node 3's log starts past the purge"
    );

    // A restart of every node resumes from the kept snapshots.
    for n in nodes.values_mut() {
        n.stop();
    }
    let mut nodes: BTreeMap<u64, Node> = ports.keys().map(|&id| (id, start(id))).collect();
    write_batches(&mut nodes, 2);
    let again = assert_logs_identical(&mut nodes);
    assert!(
        again.iter().zip(&data).all(|(a, d)| a >= d),
        "{again:?} after {data:?}"
    );
    let (_, after) = dump(&mut nodes);
    assert_eq!(
        after[..before.len()],
        before[..],
        "node 3's log survived the restart"
    );
    for (_, mut n) in nodes {
        n.stop();
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// What a crash leaves of a leader that had not yet written its last batch: the batch's
/// bytes in its group's last segment read as zeros (an unsynced tail), all else stays.
fn lose_last_batch(group_dir: &std::path::Path) {
    let mut segments: Vec<PathBuf> = std::fs::read_dir(group_dir)
        .expect("group dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    segments.sort();
    for segment in segments.iter().rev() {
        let mut bytes = std::fs::read(segment).expect("read segment");
        let (mut pos, mut last) = (0, None);
        while let Ok(h) = batch::verify(&bytes[pos..]) {
            last = Some((pos, h));
            pos += h.total_bytes();
        }
        if let Some((pos, h)) = last {
            assert!(!h.is_control(), "the last batch is the test's write");
            bytes[pos..pos + h.total_bytes()].fill(0);
            std::fs::write(segment, bytes).expect("write segment");
            return;
        }
    }
    panic!("no batch in {}", group_dir.display());
}

#[test]
fn a_leader_restarted_without_its_unsynced_tail_loses_no_acknowledged_write() {
    let root = std::env::temp_dir().join(format!("ferrolog-raft-restore-{}", std::process::id()));
    // ferrolog's own settings (`group_config`), with elections slow enough that the old leader
    // is back well before its followers would stand.
    let config = crate::group_config(Config {
        cluster_name: "ferrolog-test".into(),
        heartbeat_interval: 100,
        election_timeout_min: 3000,
        election_timeout_max: 4000,
        ..Config::default()
    });
    let (ports, mut nodes) = start_cluster_with(&root, config.clone());
    write_batches(&mut nodes, 5);
    let _ = assert_logs_identical(&mut nodes);

    // One more write to group 0 is committed (fsynced on a majority) and acknowledged; then
    // its leader dies with that batch not yet on its own disk.
    let g = GroupId(0);
    let leader = wait_for("a leader", || agreed_leader(&mut nodes, g));
    let acked = nodes
        .get_mut(&leader)
        .unwrap()
        .ask(|r| Command::Write(g, 3, r));
    assert!(acked.is_ok(), "{acked:?}");
    let _ = assert_logs_identical(&mut nodes);
    nodes.remove(&leader).unwrap().stop();
    lose_last_batch(&root.join(format!("node-{leader}")).join("group-0"));

    // It is back at once, before any follower stands for election; the next write goes to
    // whoever leads then.
    let dir = root.join(format!("node-{leader}"));
    nodes.insert(
        leader,
        Node::start_with(leader, ports[&leader], dir, config),
    );
    write_batches(&mut nodes, 1);
    // Every replica holds the acknowledged batch and the new one, at the same offsets with
    // the same bytes (with openraft's leader restore, the old leader wrote the new batch
    // under the lost one's log id and the logs never agreed again).
    let data = assert_logs_identical(&mut nodes);
    assert_eq!(data[0], 7, "data batches in group 0");
    for (_, mut n) in nodes {
        n.stop();
    }
    let _ = std::fs::remove_dir_all(&root);
}
