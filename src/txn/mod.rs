//! The transaction coordinator (KIP-98), speaking Kafka's transaction protocol v1: the one
//! clients use while a broker does not finalize the `transaction.version` feature at 2.
//!
//! A transactional id belongs to partition `abs(javaHash(id)) % partitions` of the internal
//! topic `__transaction_state` (`transaction.state.log.num.partitions`, compacted), as in
//! Kafka, and is coordinated by the shard that owns that partition on the node that leads it.
//! Its state lives there (`Shard::txns`); every request for it hops there (`on_txn`). Each
//! change of state is appended to the partition in Kafka's key and value layouts (`codec`)
//! and takes effect once durable (committed, when replicated); meanwhile the id is busy and
//! other requests for it get CONCURRENT_TRANSACTIONS. A node that starts leading a partition
//! replays it (`load`), answers COORDINATOR_LOAD_IN_PROGRESS until done, and then finishes
//! the transactions it finds prepared; one that stops leading drops its ids.
//!
//! A transaction: InitProducerId gives the id its producer id and a new epoch (fencing any
//! older producer of the id, and aborting its open transaction); AddPartitionsToTxn records
//! the partitions it writes (Ongoing); EndTxn persists PrepareCommit or PrepareAbort and
//! answers, then the coordinator has each partition's leader append a marker (a control
//! batch that closes the transaction there, `Partition::append_marker`), and once every
//! marker is written persists CompleteCommit or CompleteAbort. A transaction open longer than
//! its timeout is aborted the same way after bumping the epoch, which fences its producer.
//! Markers go to this node's shards directly and to other nodes through the node-to-node
//! transport (`quorum::forward_to_node`).

pub mod codec;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::time::Duration;

use futures::future::LocalBoxFuture;
use futures::FutureExt;

use crate::errors::BrokerError;
use crate::group::{partition_for, OffsetsLog};
use crate::partition::Partition;
use crate::producer_state::Marker;
use crate::shard::Shard;
use crate::types::{now_ms, ShardId, TopicPartition};
use codec::TxnValue;

/// Kafka's internal topic for transaction state.
pub const TRANSACTION_TOPIC: &str = "__transaction_state";

/// The highest epoch handed to a producer: Kafka keeps `i16::MAX` for fencing, and moves a
/// transactional id to a new producer id once its epoch reaches this.
const EPOCH_MAX: i16 = i16::MAX - 1;
/// Bytes read per round while loading a partition of `__transaction_state`.
const LOAD_READ_BYTES: usize = 1 << 20;
/// Pause between rounds of writing markers a partition could not take yet.
const MARKER_RETRY: Duration = Duration::from_millis(100);
/// How long the coordinator waits before writing again the markers of a transaction a
/// partition refused as fenced (a newer coordinator, or a WriteTxnMarkers sent by a client
/// with a higher coordinator epoch, holds it there).
const FENCED_RETRY_MS: i64 = 10_000;
/// How long one round of markers to another node may take.
const MARKER_TTL: Duration = Duration::from_secs(30);

/// Kafka's `TransactionState`, with its ids in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i8)]
pub enum TxnState {
    Empty = 0,
    Ongoing = 1,
    PrepareCommit = 2,
    PrepareAbort = 3,
    CompleteCommit = 4,
    CompleteAbort = 5,
    Dead = 6,
    PrepareEpochFence = 7,
}

impl TxnState {
    /// Its name in ListTransactions and DescribeTransactions (Kafka's `TransactionState`).
    pub fn name(self) -> &'static str {
        use TxnState::*;
        match self {
            Empty => "Empty",
            Ongoing => "Ongoing",
            PrepareCommit => "PrepareCommit",
            PrepareAbort => "PrepareAbort",
            CompleteCommit => "CompleteCommit",
            CompleteAbort => "CompleteAbort",
            Dead => "Dead",
            PrepareEpochFence => "PrepareEpochFence",
        }
    }

    pub fn from_id(id: i8) -> Option<TxnState> {
        use TxnState::*;
        [
            Empty,
            Ongoing,
            PrepareCommit,
            PrepareAbort,
            CompleteCommit,
            CompleteAbort,
            Dead,
            PrepareEpochFence,
        ]
        .into_iter()
        .find(|s| *s as i8 == id)
    }
}

/// One transactional id, as its coordinator holds it.
#[derive(Debug, Clone)]
pub struct Txn {
    /// Its partition of `__transaction_state`.
    pub partition: i32,
    /// The state as last written (durable).
    pub value: TxnValue,
    /// The epoch before the last bump, so a retried InitProducerId is answered again (-1:
    /// not known, as after a load).
    last_epoch: i16,
    /// The claim of the request writing a change (or markers): others wait.
    busy: Option<u64>,
    /// Not before this time (ms) does the tick try to finish it again: set when a partition
    /// refused its markers as fenced.
    retry_at: i64,
}

/// A partition of `__transaction_state` this shard coordinates.
#[derive(Debug, Clone, Copy)]
struct Coordinated {
    loaded: bool,
    /// Its leader epoch when the load began: the coordinator epoch of the markers.
    epoch: i32,
    load: u64,
}

/// The transactional ids of the `__transaction_state` partitions one shard owns.
#[derive(Default)]
pub struct TxnCoordinator {
    pub txns: BTreeMap<String, Txn>,
    /// Ids whose first state is being written, with the claim doing it: busy too, though
    /// not in `txns` yet.
    creating: BTreeMap<String, u64>,
    /// The last claim handed out (`claim`).
    next_claim: u64,
    partitions: HashMap<i32, Coordinated>,
    next_load: u64,
}

impl TxnCoordinator {
    /// Follows this replica's leadership of partition `index` (`leads`, in leader epoch
    /// `epoch`), as the group coordinator does (`GroupCoordinator::follow`). Returns the
    /// number of the load to run now, if one is to start.
    pub fn follow(&mut self, index: i32, leads: bool, epoch: i32) -> Option<u64> {
        match self.partitions.get(&index) {
            Some(c) if leads && c.epoch == epoch => None,
            Some(_) if leads => {
                self.unload(index);
                self.follow(index, leads, epoch)
            }
            None if leads => {
                tracing::info!(
                    partition = index,
                    "leading a {TRANSACTION_TOPIC} partition: loading it"
                );
                self.next_load += 1;
                self.partitions.insert(
                    index,
                    Coordinated {
                        loaded: false,
                        epoch,
                        load: self.next_load,
                    },
                );
                Some(self.next_load)
            }
            Some(_) => {
                tracing::info!(
                    partition = index,
                    "no longer leading a {TRANSACTION_TOPIC} partition"
                );
                self.unload(index);
                None
            }
            None => None,
        }
    }

    /// Stops coordinating partition `index`: its ids are dropped.
    pub fn unload(&mut self, index: i32) {
        self.partitions.remove(&index);
        self.txns.retain(|_, t| t.partition != index);
    }

    /// Whether a partition this shard leads is still loading (ListTransactions then answers
    /// COORDINATOR_LOAD_IN_PROGRESS, as Kafka does).
    pub fn loading(&self) -> bool {
        self.partitions.values().any(|c| !c.loaded)
    }

    fn is_current_load(&self, index: i32, load: u64) -> bool {
        self.partitions.get(&index).is_some_and(|c| c.load == load)
    }

    /// The coordinator epoch of partition `index` if it is loaded in leader epoch `epoch`.
    fn loaded_in(&self, index: i32, epoch: i32) -> Option<u64> {
        self.partitions
            .get(&index)
            .filter(|c| c.loaded && c.epoch == epoch)
            .map(|c| c.load)
    }

    /// The ids of loaded partitions that may be forgotten at `now` (`expirable`).
    fn expired(&self, now: i64, expiration_ms: i64) -> Vec<String> {
        self.txns
            .iter()
            .filter(|(_, t)| self.partitions.get(&t.partition).is_some_and(|c| c.loaded))
            .filter(|(_, t)| t.busy.is_none() && expirable(t, now, expiration_ms))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// The ids of loaded partition `index` whose transaction is prepared (their markers are
    /// to be written) or, with `timeouts`, has run past its timeout at `now`.
    fn due(&self, index: i32, now: i64, timeouts: bool) -> Vec<String> {
        if !self.partitions.get(&index).is_some_and(|c| c.loaded) {
            return Vec::new();
        }
        self.txns
            .iter()
            .filter(|(_, t)| t.partition == index && t.busy.is_none() && t.retry_at <= now)
            .filter(|(_, t)| match t.value.state {
                TxnState::PrepareCommit | TxnState::PrepareAbort => true,
                TxnState::Ongoing => {
                    timeouts && t.value.start_ms + i64::from(t.value.timeout_ms) < now
                }
                _ => false,
            })
            .map(|(id, _)| id.clone())
            .collect()
    }
}

/// Replays partition `index` of `__transaction_state` (`log`) up to its HW into `txns`, then
/// marks it loaded, unless another load or an unload replaced this one (`load`).
pub async fn load(txns: &RefCell<TxnCoordinator>, index: i32, log: &Partition, load: u64) {
    let end = log.high_watermark();
    let mut offset = log.log_start();
    let mut records = 0usize;
    while offset < end {
        let bytes = match log.read_committed(offset, LOAD_READ_BYTES).await {
            Ok(bytes) if !bytes.is_empty() => bytes,
            Ok(_) => break,
            Err(e) => {
                tracing::error!(partition = index, offset, error = %e,
                    "cannot read {TRANSACTION_TOPIC}; its transactions stay unavailable");
                return;
            }
        };
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let header = match ferrolog_io::batch::verify(rest) {
                Ok(h) => h,
                Err(e) => {
                    tracing::error!(partition = index, offset, error = %e,
                        "damaged batch in {TRANSACTION_TOPIC}; its transactions stay unavailable");
                    return;
                }
            };
            let mut c = txns.borrow_mut();
            if !c.is_current_load(index, load) {
                return;
            }
            let decoded = crate::group::codec::decode_key_value_batch(&header, rest, |k, v| {
                records += 1;
                replay(&mut c, index, k, v);
            });
            if let Err(e) = decoded {
                tracing::warn!(partition = index, offset = header.base_offset, error = %e,
                    "skipping a batch of {TRANSACTION_TOPIC} that does not decode");
            }
            offset = header.next_offset();
            rest = &rest[header.total_bytes()..];
        }
    }
    let mut c = txns.borrow_mut();
    if let Some(p) = c.partitions.get_mut(&index).filter(|p| p.load == load) {
        p.loaded = true;
        tracing::info!(
            partition = index,
            records,
            "loaded {TRANSACTION_TOPIC} partition"
        );
    }
}

fn replay(c: &mut TxnCoordinator, index: i32, key: &[u8], value: Option<&[u8]>) {
    let id = match codec::decode_key(key) {
        Ok(Some(id)) => id,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(partition = index, error = %e, "skipping a {TRANSACTION_TOPIC} record");
            return;
        }
    };
    match value.map(codec::decode_value) {
        None => {
            c.txns.remove(&id);
        }
        Some(Ok(value)) => {
            c.txns.insert(
                id,
                Txn {
                    partition: index,
                    value,
                    last_epoch: -1,
                    busy: None,
                    retry_at: 0,
                },
            );
        }
        Some(Err(e)) => {
            tracing::warn!(partition = index, id, error = %e, "skipping a {TRANSACTION_TOPIC} record");
        }
    }
}

/// Partitions of `__transaction_state`: this shard coordinates a partition's ids while it
/// leads it, loading them once it is a ready leader, and drops them when it stops leading.
pub fn follow_leadership(shard: &Rc<Shard>) {
    let Some(partitions) = shard.image().topic(TRANSACTION_TOPIC).map(|t| t.partitions) else {
        return;
    };
    for index in 0..partitions {
        let tp = TopicPartition {
            topic: TRANSACTION_TOPIC.to_string(),
            partition: index,
        };
        let Some(p) = shard.partition(&tp) else {
            continue; // another shard's or another node's
        };
        let (leads, epoch) = (p.is_leader(), p.leader_epoch());
        let Some(load_id) = shard.txns.borrow_mut().follow(index, leads, epoch) else {
            continue;
        };
        let shard = shard.clone();
        glommio::spawn_local(async move { load(&shard.txns, index, &p, load_id).await }).detach();
    }
}

/// How often a shard follows the leadership of its `__transaction_state` partitions and
/// finishes prepared transactions.
const TICK_MS: u64 = 100;

/// The shard's periodic work for its `__transaction_state` partitions: follows their
/// leadership, finishes prepared transactions (after a load), every
/// `transaction.abort.timed.out.transaction.cleanup.interval.ms` aborts those past their
/// timeout, and every `transaction.remove.expired.transaction.cleanup.interval.ms` forgets
/// the ids past `transactional.id.expiration.ms`.
pub async fn tick_loop(shard: Rc<Shard>) {
    let cfg = shard.config.txn.clone();
    let mut next_timeouts = now_ms() + cfg.abort_timed_out_interval_ms;
    let mut next_expiry = now_ms() + cfg.remove_expired_interval_ms;
    loop {
        glommio::timer::sleep(Duration::from_millis(TICK_MS)).await;
        follow_leadership(&shard);
        let now = now_ms();
        let timeouts = now >= next_timeouts;
        if timeouts {
            next_timeouts = now + cfg.abort_timed_out_interval_ms;
        }
        tick(&shard, now, timeouts);
        if now >= next_expiry {
            next_expiry = now + cfg.remove_expired_interval_ms;
            let expired = shard.txns.borrow().expired(now, cfg.id_expiration_ms);
            for id in expired {
                let shard = shard.clone();
                glommio::spawn_local(async move {
                    if let Err(e) = expire(&shard, &id, cfg.id_expiration_ms).await {
                        tracing::debug!(id, error = %e, "could not expire a transactional id yet");
                    }
                })
                .detach();
            }
        }
    }
}

/// Whether `txn` may be forgotten at `now` (Kafka's `shouldExpire`): no transaction open or
/// being finished, and no change for `expiration_ms`.
fn expirable(txn: &Txn, now: i64, expiration_ms: i64) -> bool {
    let idle = matches!(
        txn.value.state,
        TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
    );
    idle && txn.value.last_update_ms <= now - expiration_ms
}

/// Forgets transactional id `id` (on this shard) if it is still expirable once claimed:
/// writes its tombstone, then drops it, as Kafka does (its producer id goes with it: the
/// next InitProducerId of the id gets a new one).
async fn expire(shard: &Rc<Shard>, id: &str, expiration_ms: i64) -> Result<(), BrokerError> {
    let Some(index) = shard.txns.borrow().txns.get(id).map(|t| t.partition) else {
        return Ok(());
    };
    let tp = TopicPartition {
        topic: TRANSACTION_TOPIC.to_string(),
        partition: index,
    };
    let partition = shard.partition(&tp).ok_or(BrokerError::NotCoordinator)?;
    check_coordinator(shard, &partition).await?;
    let busy = claim(&shard.txns, &partition, id)?;
    let still = shard
        .txns
        .borrow()
        .txns
        .get(id)
        .is_some_and(|t| expirable(t, now_ms(), expiration_ms));
    if !still {
        return Ok(());
    }
    append(shard, &partition, &busy, None).await?;
    let mut txns = shard.txns.borrow_mut();
    if txns.is_current_load(partition.index, busy.load) {
        tracing::info!(id, "transactional id expired");
        txns.txns.remove(id);
    }
    Ok(())
}

fn tick(shard: &Rc<Shard>, now: i64, timeouts: bool) {
    let indexes: Vec<i32> = shard.txns.borrow().partitions.keys().copied().collect();
    for index in indexes {
        let due = shard.txns.borrow().due(index, now, timeouts);
        for id in due {
            let shard = shard.clone();
            glommio::spawn_local(async move {
                if let Err(e) = finish(&shard, &id).await {
                    tracing::debug!(id, error = %e, "could not finish a transaction yet");
                }
            })
            .detach();
        }
    }
}

/// Runs `f` on the shard that coordinates `transactional_id`, with its partition of
/// `__transaction_state`, once that shard may serve it: it leads the partition, has loaded
/// it, and holds a lease. NOT_COORDINATOR when this node does not lead it (or the topic does
/// not exist: FindCoordinator creates it); COORDINATOR_LOAD_IN_PROGRESS while it loads.
pub async fn on_txn<T, F>(shard: &Rc<Shard>, transactional_id: &str, f: F) -> Result<T, BrokerError>
where
    T: Send + 'static,
    F: FnOnce(Rc<Shard>, Rc<Partition>) -> LocalBoxFuture<'static, Result<T, BrokerError>>
        + Send
        + 'static,
{
    if transactional_id.is_empty() || transactional_id.len() > i16::MAX as usize {
        // Its record keeps it as an int16-length string.
        return Err(BrokerError::InvalidRequest(
            "transactional id must be 1 to 32767 bytes".into(),
        ));
    }
    let image = shard.image();
    let topic = image
        .topic(TRANSACTION_TOPIC)
        .ok_or(BrokerError::NotCoordinator)?;
    let tp = TopicPartition {
        topic: TRANSACTION_TOPIC.to_string(),
        partition: partition_for(transactional_id, topic.partitions),
    };
    let owner = shard
        .owner_of(&image, &tp)
        .map_err(|_| BrokerError::NotCoordinator)?;
    shard
        .invoke_on(owner, move |s| {
            let s = s.clone();
            let Some(partition) = s.partition(&tp) else {
                return async { Err(BrokerError::NotCoordinator) }.boxed_local();
            };
            async move {
                check_coordinator(&s, &partition).await?;
                f(s, partition).await
            }
            .boxed_local()
        })
        .await
}

/// The coordinator epoch this replica serves `partition`'s ids in, once it may: it leads,
/// has loaded them in its current leader epoch, and holds a lease.
async fn check_coordinator(shard: &Shard, partition: &Partition) -> Result<u64, BrokerError> {
    let serves = || {
        if !partition.is_leader() {
            return Err(BrokerError::NotCoordinator);
        }
        let txns = shard.txns.borrow();
        match txns.partitions.get(&partition.index) {
            None => Err(BrokerError::NotCoordinator),
            Some(_) => txns
                .loaded_in(partition.index, partition.leader_epoch())
                .ok_or(BrokerError::CoordinatorLoadInProgress),
        }
    };
    serves()?;
    partition
        .read_lease()
        .await
        .map_err(|_| BrokerError::NotCoordinator)?;
    serves()
}

/// Claims `id` for a change, in the load of `partition` under way (NOT_COORDINATOR if it
/// is not loaded in its current leader epoch): CONCURRENT_TRANSACTIONS while another
/// request holds it. An id not known yet is claimed too, so two first InitProducerIds
/// cannot both create it. The claim ends when the returned `Busy` is dropped.
fn claim<'a>(
    txns: &'a RefCell<TxnCoordinator>,
    partition: &Partition,
    id: &'a str,
) -> Result<Busy<'a>, BrokerError> {
    claim_in(txns, partition.index, partition.leader_epoch(), id)
}

/// `claim` of partition `index` in leader epoch `epoch`.
fn claim_in<'a>(
    txns: &'a RefCell<TxnCoordinator>,
    index: i32,
    epoch: i32,
    id: &'a str,
) -> Result<Busy<'a>, BrokerError> {
    let mut c = txns.borrow_mut();
    let c = &mut *c;
    let load = c
        .loaded_in(index, epoch)
        .ok_or(BrokerError::NotCoordinator)?;
    c.next_claim += 1;
    let ticket = c.next_claim;
    match c.txns.get_mut(id) {
        Some(t) if t.busy.is_some() => return Err(BrokerError::ConcurrentTransactions),
        Some(t) => t.busy = Some(ticket),
        None if c.creating.contains_key(id) => return Err(BrokerError::ConcurrentTransactions),
        None => {
            c.creating.insert(id.to_string(), ticket);
        }
    }
    Ok(Busy {
        txns,
        id,
        ticket,
        load,
    })
}

/// A claim on an id (`claim`), released when dropped (the request finished, failed, or was
/// dropped). It releases only itself: a claim from an earlier load, which a reload
/// replaced, leaves a later one alone.
struct Busy<'a> {
    txns: &'a RefCell<TxnCoordinator>,
    id: &'a str,
    ticket: u64,
    /// The load it was claimed in: its writes take effect only while that load lasts.
    load: u64,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let mut c = self.txns.borrow_mut();
        if c.creating.get(self.id) == Some(&self.ticket) {
            c.creating.remove(self.id);
        }
        if let Some(t) = c
            .txns
            .get_mut(self.id)
            .filter(|t| t.busy == Some(self.ticket))
        {
            t.busy = None;
        }
    }
}

/// Writes `value` for the id `busy` claims to its partition and, once durable and if the
/// load it was claimed in still lasts, takes it as the id's state (with `last_epoch`).
async fn write(
    shard: &Shard,
    partition: &Rc<Partition>,
    busy: &Busy<'_>,
    value: TxnValue,
    last_epoch: i16,
) -> Result<(), BrokerError> {
    append(shard, partition, busy, Some(&value)).await?;
    let mut txns = shard.txns.borrow_mut();
    if !txns.is_current_load(partition.index, busy.load) {
        return Err(BrokerError::NotCoordinator);
    }
    let txn = txns.txns.entry(busy.id.to_string()).or_insert_with(|| Txn {
        partition: partition.index,
        value: value.clone(),
        last_epoch,
        busy: Some(busy.ticket), // released by `busy`
        retry_at: 0,
    });
    txn.value = value;
    txn.last_epoch = last_epoch;
    Ok(())
}

/// Appends the record (`value`, or a tombstone) of the id `busy` claims to its partition,
/// if the load it was claimed in still lasts (NOT_COORDINATOR otherwise: a request from an
/// earlier leadership writes nothing), and waits until it is durable. Kafka's answers for
/// a write that fails: NOT_COORDINATOR when this node stopped leading,
/// COORDINATOR_NOT_AVAILABLE otherwise.
async fn append(
    shard: &Shard,
    partition: &Rc<Partition>,
    busy: &Busy<'_>,
    value: Option<&TxnValue>,
) -> Result<(), BrokerError> {
    if shard
        .txns
        .borrow()
        .loaded_in(partition.index, partition.leader_epoch())
        != Some(busy.load)
    {
        return Err(BrokerError::NotCoordinator);
    }
    let (id, key) = (busy.id, codec::encode_key(busy.id));
    let encoded = value.map(codec::encode_value);
    let now = now_ms();
    let batch = crate::group::codec::encode_key_value_batch(&[(&key[..], encoded.as_deref())], now);
    partition
        .append_batch(&batch, now)
        .await
        .map_err(|e| match e {
            BrokerError::NotLeaderOrFollower | BrokerError::Storage(_) => {
                BrokerError::NotCoordinator
            }
            e => {
                tracing::warn!(id, error = %e, "writing to {TRANSACTION_TOPIC} failed");
                BrokerError::CoordinatorNotAvailable(e.to_string())
            }
        })?;
    Ok(())
}

/// A new producer id from this node's range (persisted on shard 0 before it is handed out).
pub async fn allocate_producer_id(shard: &Rc<Shard>) -> Result<i64, BrokerError> {
    shard
        .on_controller(|shard| {
            async move {
                let ids = shard
                    .producer_ids
                    .as_ref()
                    .expect("producer ids live on shard 0");
                ids.allocate().await.map_err(|e| e.to_string())
            }
            .boxed_local()
        })
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "cannot persist the producer id counter");
            BrokerError::Storage(e)
        })
}

/// What InitProducerId asks of a transactional id.
pub struct InitRequest {
    pub transactional_id: String,
    pub timeout_ms: i32,
    /// KIP-360: the producer id and epoch the producer had, or -1 and -1.
    pub producer_id: i64,
    pub producer_epoch: i16,
}

/// InitProducerId with a transactional id: the id's producer id and its next epoch. An open
/// transaction is aborted first (fencing its producer), and the caller is told to retry
/// (CONCURRENT_TRANSACTIONS) as in Kafka.
pub async fn init_producer_id(
    shard: &Rc<Shard>,
    req: InitRequest,
    max_timeout_ms: i32,
) -> Result<(i64, i16), BrokerError> {
    if req.timeout_ms <= 0 || req.timeout_ms > max_timeout_ms {
        return Err(BrokerError::InvalidTransactionTimeout);
    }
    let id = req.transactional_id.clone();
    on_txn(shard, &id, move |shard, partition| {
        async move {
            let id = req.transactional_id.as_str();
            let busy = claim(&shard.txns, &partition, id)?;
            let now = now_ms();
            let current = shard.txns.borrow().txns.get(id).cloned();
            let Some(txn) = current else {
                let producer_id = allocate_producer_id(&shard).await?;
                let value = TxnValue {
                    producer_id,
                    producer_epoch: 0,
                    timeout_ms: req.timeout_ms,
                    state: TxnState::Empty,
                    partitions: BTreeSet::new(),
                    last_update_ms: now,
                    start_ms: -1,
                };
                write(&shard, &partition, &busy, value, -1).await?;
                return Ok((producer_id, 0));
            };
            let v = &txn.value;
            if req.producer_id >= 0 && req.producer_id != v.producer_id {
                return Err(BrokerError::ProducerFenced);
            }
            match v.state {
                TxnState::PrepareCommit | TxnState::PrepareAbort => {
                    return Err(BrokerError::ConcurrentTransactions)
                }
                TxnState::Ongoing => {
                    // Fence the producer of the open transaction and abort it; the caller
                    // retries and gets the epoch after.
                    let fenced = TxnValue {
                        // Kafka fences an exhausted epoch with i16::MAX.
                        producer_epoch: v.producer_epoch.saturating_add(1),
                        state: TxnState::PrepareAbort,
                        last_update_ms: now,
                        ..v.clone()
                    };
                    write(&shard, &partition, &busy, fenced, txn.last_epoch).await?;
                    return Err(BrokerError::ConcurrentTransactions);
                }
                _ => {}
            }
            let (producer_id, epoch, last_epoch) = if v.producer_epoch >= EPOCH_MAX {
                (allocate_producer_id(&shard).await?, 0, -1)
            } else if req.producer_epoch < 0 {
                // A new producer of the id: no earlier epoch of its own to retry with.
                (v.producer_id, v.producer_epoch + 1, -1)
            } else if req.producer_epoch == v.producer_epoch {
                (v.producer_id, v.producer_epoch + 1, v.producer_epoch)
            } else if req.producer_epoch == txn.last_epoch {
                return Ok((v.producer_id, v.producer_epoch)); // a retry, answered again
            } else {
                return Err(BrokerError::ProducerFenced);
            };
            let value = TxnValue {
                producer_id,
                producer_epoch: epoch,
                timeout_ms: req.timeout_ms,
                state: TxnState::Empty,
                partitions: BTreeSet::new(),
                last_update_ms: now,
                start_ms: -1,
            };
            write(&shard, &partition, &busy, value, last_epoch).await?;
            Ok((producer_id, epoch))
        }
        .boxed_local()
    })
    .await
}

/// The checks AddPartitionsToTxn and EndTxn make of the producer: the id's producer id
/// (INVALID_PRODUCER_ID_MAPPING) and its current epoch (PRODUCER_FENCED).
fn check_producer(txn: Option<&Txn>, producer_id: i64, epoch: i16) -> Result<&Txn, BrokerError> {
    let txn = txn
        .filter(|t| t.value.producer_id == producer_id)
        .ok_or(BrokerError::InvalidProducerIdMapping)?;
    if txn.value.producer_epoch != epoch {
        return Err(BrokerError::ProducerFenced);
    }
    Ok(txn)
}

/// AddPartitionsToTxn (the client's form): adds `partitions` to the open transaction of
/// `transactional_id`, opening it if none is.
pub async fn add_partitions(
    shard: &Rc<Shard>,
    transactional_id: String,
    producer_id: i64,
    epoch: i16,
    partitions: Vec<(String, i32)>,
) -> Result<(), BrokerError> {
    let id = transactional_id.clone();
    on_txn(shard, &id, move |shard, partition| {
        async move {
            let id = transactional_id.as_str();
            let value = {
                let txns = shard.txns.borrow();
                let txn = check_producer(txns.txns.get(id), producer_id, epoch)?;
                if txn.busy.is_some() {
                    return Err(BrokerError::ConcurrentTransactions);
                }
                let v = &txn.value;
                match v.state {
                    TxnState::PrepareCommit | TxnState::PrepareAbort => {
                        return Err(BrokerError::ConcurrentTransactions)
                    }
                    TxnState::Ongoing if partitions.iter().all(|p| v.partitions.contains(p)) => {
                        return Ok(())
                    }
                    _ => {}
                }
                let now = now_ms();
                let mut value = v.clone();
                if v.state != TxnState::Ongoing {
                    value.partitions.clear();
                    value.start_ms = now;
                }
                value.state = TxnState::Ongoing;
                value.partitions.extend(partitions);
                value.last_update_ms = now;
                value
            };
            let busy = claim(&shard.txns, &partition, id)?;
            let last_epoch = shard
                .txns
                .borrow()
                .txns
                .get(id)
                .map_or(-1, |t| t.last_epoch);
            write(&shard, &partition, &busy, value, last_epoch).await
        }
        .boxed_local()
    })
    .await
}

/// AddOffsetsToTxn: adds group `group_id`'s partition of `__consumer_offsets` to the
/// transaction, for its TxnOffsetCommit (KIP-447).
pub async fn add_offsets(
    shard: &Rc<Shard>,
    transactional_id: String,
    producer_id: i64,
    epoch: i16,
    group_id: &str,
) -> Result<(), BrokerError> {
    let partitions = shard
        .image()
        .topic(crate::group::OFFSETS_TOPIC)
        .map_or(shard.config.group.offsets_topic_partitions, |t| {
            t.partitions
        });
    let partition = (
        crate::group::OFFSETS_TOPIC.to_string(),
        partition_for(group_id, partitions),
    );
    add_partitions(shard, transactional_id, producer_id, epoch, vec![partition]).await
}

/// EndTxn: persists PrepareCommit or PrepareAbort and answers; the markers and the
/// completion follow in the background (`finish`). A retry of a finished one is answered
/// again.
pub async fn end_txn(
    shard: &Rc<Shard>,
    transactional_id: String,
    producer_id: i64,
    epoch: i16,
    commit: bool,
) -> Result<(), BrokerError> {
    let id = transactional_id.clone();
    on_txn(shard, &id, move |shard, partition| {
        async move {
            let id = transactional_id.as_str();
            let (value, last_epoch) = {
                let txns = shard.txns.borrow();
                let txn = check_producer(txns.txns.get(id), producer_id, epoch)?;
                if txn.busy.is_some() {
                    return Err(BrokerError::ConcurrentTransactions);
                }
                let v = &txn.value;
                let prepared = match commit {
                    true => TxnState::PrepareCommit,
                    false => TxnState::PrepareAbort,
                };
                match (v.state, commit) {
                    (TxnState::Ongoing, _) => {}
                    (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => {
                        return Ok(())
                    }
                    (s, _) if s == prepared => return Err(BrokerError::ConcurrentTransactions),
                    _ => return Err(BrokerError::InvalidTxnState),
                }
                let value = TxnValue {
                    state: prepared,
                    last_update_ms: now_ms(),
                    ..v.clone()
                };
                (value, txn.last_epoch)
            };
            {
                let busy = claim(&shard.txns, &partition, id)?;
                write(&shard, &partition, &busy, value, last_epoch).await?;
            }
            let (shard, id) = (shard.clone(), id.to_string());
            glommio::spawn_local(async move {
                if let Err(e) = finish(&shard, &id).await {
                    tracing::debug!(id, error = %e, "markers not written yet; the tick retries");
                }
            })
            .detach();
            Ok(())
        }
        .boxed_local()
    })
    .await
}

/// DescribeTransactions: the state of `transactional_id` at its coordinator
/// (TRANSACTIONAL_ID_NOT_FOUND if it has none).
pub async fn describe(
    shard: &Rc<Shard>,
    transactional_id: String,
) -> Result<TxnValue, BrokerError> {
    let id = transactional_id.clone();
    on_txn(shard, &id, move |shard, _| {
        async move {
            let txns = shard.txns.borrow();
            txns.txns
                .get(&transactional_id)
                .filter(|t| t.value.state != TxnState::Dead)
                .map(|t| t.value.clone())
                .ok_or(BrokerError::TransactionalIdNotFound)
        }
        .boxed_local()
    })
    .await
}

/// KIP-890 part 1: whether `partition` is in the open transaction of `transactional_id`'s
/// producer `producer_id` at `epoch` (INVALID_TXN_STATE if not, PRODUCER_FENCED for another
/// epoch, INVALID_PRODUCER_ID_MAPPING for another producer), asked of its coordinator here
/// or on the node that leads its partition of `__transaction_state`.
pub async fn verify(
    shard: &Rc<Shard>,
    transactional_id: String,
    producer_id: i64,
    epoch: i16,
    partition: (String, i32),
) -> Result<(), BrokerError> {
    let image = shard.image();
    let topic = image
        .topic(TRANSACTION_TOPIC)
        .ok_or(BrokerError::NotCoordinator)?;
    let index = partition_for(&transactional_id, topic.partitions);
    let leader = topic
        .leader(index, &image)
        .ok_or(BrokerError::NotCoordinator)?;
    if leader != shard.config.node_id {
        let request = crate::quorum::Forwarded::VerifyTxn {
            transactional_id,
            producer_id,
            epoch,
            partition,
        };
        let ttl = Duration::from_secs(10);
        return crate::quorum::forward_to_node(shard, leader, request, 1, ttl)
            .await
            .remove(0);
    }
    verify_here(shard, transactional_id, producer_id, epoch, partition).await
}

/// `verify` at this node's coordinator (NOT_COORDINATOR if it is not the id's).
pub async fn verify_here(
    shard: &Rc<Shard>,
    transactional_id: String,
    producer_id: i64,
    epoch: i16,
    partition: (String, i32),
) -> Result<(), BrokerError> {
    let id = transactional_id.clone();
    on_txn(shard, &id, move |shard, _| {
        async move {
            let txns = shard.txns.borrow();
            let txn = check_producer(txns.txns.get(&transactional_id), producer_id, epoch)?;
            let v = &txn.value;
            match v.state == TxnState::Ongoing && v.partitions.contains(&partition) {
                true => Ok(()),
                false => Err(BrokerError::InvalidTxnState),
            }
        }
        .boxed_local()
    })
    .await
}

/// Takes the transaction of `id` (on this shard) to its end: one past its timeout is first
/// prepared to abort under a bumped epoch (fencing its producer); a prepared one gets its
/// markers written, then its completion persisted.
async fn finish(shard: &Rc<Shard>, id: &str) -> Result<(), BrokerError> {
    let Some(txn) = shard.txns.borrow().txns.get(id).cloned() else {
        return Ok(());
    };
    let tp = TopicPartition {
        topic: TRANSACTION_TOPIC.to_string(),
        partition: txn.partition,
    };
    let partition = shard.partition(&tp).ok_or(BrokerError::NotCoordinator)?;
    check_coordinator(shard, &partition).await?;
    let busy = claim(&shard.txns, &partition, id)?;
    // The leader epoch the claim's load began in: the markers' coordinator epoch.
    let coordinator_epoch = partition.leader_epoch();
    let (mut value, last_epoch) = match shard.txns.borrow().txns.get(id) {
        Some(t) => (t.value.clone(), t.last_epoch),
        None => return Err(BrokerError::NotCoordinator),
    };
    if value.state == TxnState::Ongoing {
        // Looked at again now that it is claimed: a transaction begun since is not late.
        if value.start_ms + i64::from(value.timeout_ms) >= now_ms() {
            return Ok(());
        }
        tracing::info!(
            id,
            timeout_ms = value.timeout_ms,
            "aborting a transaction past its timeout"
        );
        value = TxnValue {
            producer_epoch: value.producer_epoch.saturating_add(1),
            state: TxnState::PrepareAbort,
            last_update_ms: now_ms(),
            ..value
        };
        write(shard, &partition, &busy, value.clone(), last_epoch).await?;
    }
    let commit = match value.state {
        TxnState::PrepareCommit => true,
        TxnState::PrepareAbort => false,
        _ => return Ok(()),
    };
    let marker = Marker {
        commit,
        coordinator_epoch,
    };
    let mut left: Vec<(String, i32)> = value.partitions.iter().cloned().collect();
    while !left.is_empty() {
        if partition.leader_epoch() != coordinator_epoch || !partition.is_leader() {
            return Err(BrokerError::NotCoordinator);
        }
        let results = write_markers(
            shard,
            value.producer_id,
            value.producer_epoch,
            marker,
            &left,
        )
        .await;
        let mut retry = Vec::new();
        for (tp, result) in left.into_iter().zip(results) {
            match result {
                Ok(()) => {}
                // Gone with its topic: nothing to close there.
                // By code: another node's answers come back as codes.
                Err(e)
                    if e.code() == BrokerError::UnknownTopicOrPartition.code()
                        && shard
                            .image()
                            .topic(&tp.0)
                            .is_none_or(|t| tp.1 >= t.partitions) => {}
                Err(e)
                    if e.code() == BrokerError::InvalidProducerEpoch.code()
                        || e.code() == BrokerError::TransactionCoordinatorFenced.code() =>
                {
                    tracing::warn!(id, topic = tp.0, partition = tp.1, error = %e,
                        "a partition refused the transaction's marker; leaving it to a newer coordinator, retrying in 10 s");
                    if let Some(t) = shard.txns.borrow_mut().txns.get_mut(id) {
                        t.retry_at = now_ms() + FENCED_RETRY_MS;
                    }
                    return Err(e);
                }
                Err(e) => {
                    tracing::debug!(id, topic = tp.0, partition = tp.1, error = %e, "marker not written; retrying");
                    retry.push(tp);
                }
            }
        }
        left = retry;
        if !left.is_empty() {
            glommio::timer::sleep(MARKER_RETRY).await;
        }
    }
    let done = TxnValue {
        state: if commit {
            TxnState::CompleteCommit
        } else {
            TxnState::CompleteAbort
        },
        partitions: BTreeSet::new(),
        last_update_ms: now_ms(),
        ..value
    };
    write(shard, &partition, &busy, done, last_epoch).await
}

/// Has the leader of each of `partitions` append the marker (this node's partitions on their
/// shards, other nodes' through the node-to-node transport), and answers per partition.
async fn write_markers(
    shard: &Rc<Shard>,
    producer_id: i64,
    producer_epoch: i16,
    marker: Marker,
    partitions: &[(String, i32)],
) -> Vec<Result<(), BrokerError>> {
    let image = shard.image();
    let mut by_node: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
    let mut results: Vec<Result<(), BrokerError>> = partitions
        .iter()
        .map(|_| Err(BrokerError::NotLeaderOrFollower))
        .collect();
    for (i, (topic, p)) in partitions.iter().enumerate() {
        match image.topic(topic) {
            None => results[i] = Err(BrokerError::UnknownTopicOrPartition),
            Some(t) if *p >= t.partitions => results[i] = Err(BrokerError::UnknownTopicOrPartition),
            Some(t) => {
                if let Some(leader) = t.leader(*p, &image) {
                    by_node.entry(leader).or_default().push(i);
                }
            }
        }
    }
    for (node, indexes) in by_node {
        let wanted: Vec<(String, i32)> = indexes.iter().map(|&i| partitions[i].clone()).collect();
        let answers = if node == shard.config.node_id {
            write_markers_here(shard, producer_id, producer_epoch, marker, wanted).await
        } else {
            let request = crate::quorum::Forwarded::WriteTxnMarkers {
                producer_id,
                producer_epoch,
                commit: marker.commit,
                coordinator_epoch: marker.coordinator_epoch,
                partitions: wanted,
            };
            crate::quorum::forward_to_node(shard, node, request, indexes.len(), MARKER_TTL).await
        };
        for (i, answer) in indexes.into_iter().zip(answers) {
            results[i] = answer;
        }
    }
    results
}

/// The leader's side of markers (Kafka's WriteTxnMarkers): each partition's owning shard
/// appends the marker, and each is answered once durable (committed, when replicated).
pub async fn write_markers_here(
    shard: &Rc<Shard>,
    producer_id: i64,
    producer_epoch: i16,
    marker: Marker,
    partitions: Vec<(String, i32)>,
) -> Vec<Result<(), BrokerError>> {
    let image = shard.image();
    let writes = partitions.into_iter().map(|(topic, index)| {
        let tp = TopicPartition {
            topic,
            partition: index,
        };
        let owner: Result<ShardId, BrokerError> = shard.owner_of(&image, &tp);
        let shard = shard.clone();
        async move {
            let owner = owner?;
            shard
                .invoke_on(owner, move |s| {
                    let Some(p) = s.partition(&tp) else {
                        return async { Err(BrokerError::UnknownTopicOrPartition) }.boxed_local();
                    };
                    let step = p.append_marker(producer_id, producer_epoch, marker, now_ms());
                    let s = s.clone();
                    async move {
                        step?.finish(&p.log, true).await?;
                        if p.topic == crate::group::OFFSETS_TOPIC {
                            // The transaction's offsets show, or go (KIP-447).
                            let cfg = &s.config.group;
                            crate::group::complete_txn(
                                &s.groups,
                                cfg,
                                p.index,
                                producer_id,
                                marker.commit,
                            );
                        }
                        Ok(())
                    }
                    .boxed_local()
                })
                .await
        }
    });
    futures::future::join_all(writes).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A coordinator that leads partition 0 in `epoch`, loaded.
    fn loaded(c: &RefCell<TxnCoordinator>, epoch: i32) {
        let mut c = c.borrow_mut();
        c.follow(0, true, epoch).expect("a load starts");
        c.partitions.get_mut(&0).expect("followed").loaded = true;
    }

    fn value() -> TxnValue {
        TxnValue {
            producer_id: 7,
            producer_epoch: 0,
            timeout_ms: 60_000,
            state: TxnState::Empty,
            partitions: BTreeSet::new(),
            last_update_ms: 0,
            start_ms: -1,
        }
    }

    #[test]
    fn a_claim_from_an_earlier_load_does_not_release_a_later_one() {
        let c = RefCell::new(TxnCoordinator::default());
        loaded(&c, 1);
        let key = codec::encode_key("x");
        let encoded = codec::encode_value(&value());
        replay(&mut c.borrow_mut(), 0, &key, Some(&encoded));
        let stale = claim_in(&c, 0, 1, "x").expect("x is free");
        assert!(matches!(
            claim_in(&c, 0, 1, "x"),
            Err(BrokerError::ConcurrentTransactions)
        ));
        // The leader epoch moves on this node: a reload replays x, not busy.
        loaded(&c, 2);
        replay(&mut c.borrow_mut(), 0, &key, Some(&encoded));
        assert!(
            matches!(claim_in(&c, 0, 1, "x"), Err(BrokerError::NotCoordinator)),
            "no claim in a load that is gone"
        );
        let current = claim_in(&c, 0, 2, "x").expect("free in the new load");
        drop(stale);
        assert!(
            matches!(
                claim_in(&c, 0, 2, "x"),
                Err(BrokerError::ConcurrentTransactions)
            ),
            "the stale claim released the current one"
        );
        drop(current);
        claim_in(&c, 0, 2, "x").expect("free again");
    }

    #[test]
    fn an_id_being_created_is_claimed_once() {
        let c = RefCell::new(TxnCoordinator::default());
        loaded(&c, 1);
        let first = claim_in(&c, 0, 1, "new").expect("unknown ids can be claimed");
        assert!(matches!(
            claim_in(&c, 0, 1, "new"),
            Err(BrokerError::ConcurrentTransactions)
        ));
        drop(first);
        claim_in(&c, 0, 1, "new").expect("free again");
    }
}
