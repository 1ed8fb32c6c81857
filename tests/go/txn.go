package main

// The "eos" subcommand of franzcheck, for tests/test_franz_go.py.
//
//	franzcheck eos BOOTSTRAP GROUP IN_TOPIC OUT_TOPIC TXN_ID BATCH DELAY_MS INIT CRASH
//
// One member of a consume-transform-produce pipeline with exactly-once semantics
// (KIP-98 transactions, KIP-447 group offsets in the transaction), through
// kgo.GroupTransactSession: it consumes IN_TOPIC in consumer group GROUP
// (read_committed), and for each poll of up to BATCH records begins a transaction
// under TXN_ID, copies each record to the same partition of OUT_TOPIC (value as
// is, key "PARTITION:OFFSET" of the input), sleeping DELAY_MS per record, and ends
// it with End(TryCommit), which commits the polled offsets in the transaction
// (TxnOffsetCommit) and aborts instead if the group rebalanced meanwhile.
//
// INIT "lazy" leaves InitProducerId to franz-go, which sends it with the first
// transaction, after the group has assigned partitions and fetched their offsets
// (which a predecessor's pending transactional offsets hold up, KIP-447); "eager"
// sends it as the member starts, before it has joined the group, as the Java
// client's initTransactions() is called before consuming: a predecessor with the
// same TXN_ID is fenced and its open transaction aborted at once.
//
// CRASH makes it die abruptly (os.Exit(3), nothing closed, the group not left)
// in the transaction after K committed ones:
//
//	none       never
//	produce:K  once that transaction's records are all acknowledged (Flush), before
//	           its offsets are sent and before EndTxn
//	offsets:K  when the TxnOffsetCommit response of that transaction arrives, after
//	           its records are acknowledged and its offsets are pending on the group
//	           coordinator, before EndTxn
//
// It writes JSON lines to stdout, each with "t" (wall-clock seconds): start,
// producer (INIT eager: "id" and "epoch" once initialized), assign / revoke /
// lost (partitions of IN_TOPIC), txn (ended: "committed", "n" records, and per
// input partition the "first" offset and the "next" one, i.e. the offset
// committed when "committed" is true), crash ("at", "n" records of the open
// transaction acknowledged), error (fetch and produce errors), closed. franz-go's
// own log (info, each line with the time of day) goes to stderr. SIGTERM: finish
// the current transaction, leave the group, exit 0. An error ending a transaction
// exits 1.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// crashCode is the exit status of a deliberate crash, so the test can tell it
// from a failure (1) or a clean stop (0).
const crashCode = 3

// txnOffsetCommitKey is TxnOffsetCommit's API key.
const txnOffsetCommitKey = 28

// crashOnOffsets is a kgo.HookBrokerRead that kills the process when a
// TxnOffsetCommit response arrives while armed: the broker has taken the
// transaction's offsets as pending, and EndTxn has not been sent.
type crashOnOffsets struct {
	armed    atomic.Bool
	produced atomic.Int64
}

func (c *crashOnOffsets) OnBrokerRead(_ kgo.BrokerMetadata, key int16, bytesRead int, _, _ time.Duration, err error) {
	if key == txnOffsetCommitKey && err == nil && bytesRead > 0 && c.armed.Load() {
		logEvent("crash", map[string]any{"at": "offsets", "n": c.produced.Load()})
		os.Exit(crashCode)
	}
}

// parseCrash reads CRASH: the point ("", "produce" or "offsets") and K.
func parseCrash(s string) (at string, after int, err error) {
	if s == "none" {
		return "", 0, nil
	}
	at, k, ok := strings.Cut(s, ":")
	if !ok || (at != "produce" && at != "offsets") {
		return "", 0, fmt.Errorf("CRASH %q: want none, produce:K or offsets:K", s)
	}
	after, err = strconv.Atoi(k)
	if err != nil || after < 0 {
		return "", 0, fmt.Errorf("CRASH %q: K must be a count", s)
	}
	return at, after, nil
}

func runEOS(bootstrap, group, inTopic, outTopic, txnID string, batch, delayMs int, init, crash string) error {
	if init != "eager" && init != "lazy" {
		return fmt.Errorf("INIT %q: want eager or lazy", init)
	}
	crashAt, crashAfter, err := parseCrash(crash)
	if err != nil {
		return err
	}
	ctx, cancel := untilSignalled()
	defer cancel()

	hook := &crashOnOffsets{}
	sess, err := kgo.NewGroupTransactSession(
		kgo.SeedBrokers(bootstrap),
		kgo.ClientID("franz-eos-"+txnID),
		kgo.TransactionalID(txnID),
		// Far longer than any transaction here takes (well under a second), and
		// short, as it bounds how long a dead member's transaction holds up the
		// group when no member with its id comes to fence it first.
		kgo.TransactionTimeout(10*time.Second),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(inTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.SessionTimeout(6*time.Second),
		kgo.HeartbeatInterval(time.Second),
		kgo.RebalanceTimeout(20*time.Second),
		kgo.WithHooks(hook),
		kgo.WithLogger(kgo.BasicLogger(os.Stderr, kgo.LogLevelInfo, func() string {
			return time.Now().Format("15:04:05.000 ")
		})),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			logEvent("assign", map[string]any{"partitions": partitionsOf(m, inTopic)})
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			logEvent("revoke", map[string]any{"partitions": partitionsOf(m, inTopic)})
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			logEvent("lost", map[string]any{"partitions": partitionsOf(m, inTopic)})
		}),
	)
	if err != nil {
		return err
	}
	logEvent("start", map[string]any{"txn_id": txnID})
	if init == "eager" {
		initCtx, initCancel := context.WithTimeout(ctx, 60*time.Second)
		id, epoch, err := sess.Client().ProducerID(initCtx)
		initCancel()
		if err != nil {
			return fmt.Errorf("init producer id: %w", err)
		}
		logEvent("producer", map[string]any{"id": id, "epoch": epoch})
	}

	delay := time.Duration(delayMs) * time.Millisecond
	committedTxns := 0
	for ctx.Err() == nil {
		pollCtx, pollCancel := context.WithTimeout(ctx, 500*time.Millisecond)
		fetches := sess.PollRecords(pollCtx, batch)
		pollCancel()
		fetches.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				logEvent("error", map[string]any{"error": fmt.Sprintf("%s[%d]: %v", t, p, err)})
			}
		})
		records := fetches.Records()
		if len(records) == 0 {
			continue
		}
		dieAt := ""
		if committedTxns == crashAfter {
			dieAt = crashAt
		}
		committed, ranges, err := copyInTransaction(sess, hook, records, outTopic, delay, dieAt)
		if err != nil {
			return err
		}
		if committed {
			committedTxns++
		}
		logEvent("txn", map[string]any{"committed": committed, "n": len(records), "first": ranges.first, "next": ranges.next})
	}
	sess.Close() // leaves the group
	logEvent("closed", nil)
	return nil
}

// offsetRanges are, per input partition, the first offset copied and the next
// one after the last copied.
type offsetRanges struct {
	first map[string]int64
	next  map[string]int64
}

// copyInTransaction copies records to outTopic in one transaction and ends it,
// committing if every record was acknowledged; it returns whether it committed.
// dieAt "produce" exits once the records are acknowledged, "offsets" arms the
// hook for this transaction's TxnOffsetCommit.
func copyInTransaction(sess *kgo.GroupTransactSession, hook *crashOnOffsets, records []*kgo.Record,
	outTopic string, delay time.Duration, dieAt string,
) (committed bool, ranges offsetRanges, err error) {
	ranges = offsetRanges{first: map[string]int64{}, next: map[string]int64{}}
	if err := sess.Begin(); err != nil {
		return false, ranges, fmt.Errorf("begin: %w", err)
	}
	// Its own bound: SIGTERM must not cancel a transaction half-way.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e := kgo.AbortingFirstErrPromise(sess.Client())
	var acked atomic.Int64
	for _, r := range records {
		time.Sleep(delay) // the "transform"
		p := strconv.Itoa(int(r.Partition))
		if _, ok := ranges.first[p]; !ok {
			ranges.first[p] = r.Offset
		}
		ranges.next[p] = r.Offset + 1
		promise := e.Promise()
		sess.Produce(ctx, &kgo.Record{
			Topic:     outTopic,
			Partition: r.Partition,
			Key:       []byte(fmt.Sprintf("%d:%d", r.Partition, r.Offset)),
			Value:     r.Value,
		}, func(r *kgo.Record, err error) {
			if err == nil {
				acked.Add(1)
			}
			promise(r, err)
		})
	}
	if err := sess.Client().Flush(ctx); err != nil {
		return false, ranges, fmt.Errorf("flush: %w", err)
	}
	if err := e.Err(); err != nil {
		logEvent("error", map[string]any{"error": fmt.Sprintf("produce: %v", err)})
	}
	if dieAt == "produce" {
		// The records acknowledged are in the open transaction on the output
		// partitions; nothing else of it has been sent.
		logEvent("crash", map[string]any{"at": "produce", "n": acked.Load()})
		os.Exit(crashCode)
	}
	hook.produced.Store(acked.Load())
	hook.armed.Store(dieAt == "offsets")
	committed, err = sess.End(ctx, e.Err() == nil)
	if err != nil {
		return false, ranges, fmt.Errorf("end transaction: %w", err)
	}
	return committed, ranges, nil
}
