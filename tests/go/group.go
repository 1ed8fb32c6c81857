package main

// The "group" and "offsets" subcommands of franzcheck, for
// tests/test_consumer_groups_clients.py.
//
//	franzcheck group BOOTSTRAP GROUP TOPIC BALANCER DELAY_MS
//
// One member of a consumer group (kgo.ConsumerGroup), as tests/group_consumer.py
// is for librdkafka, writing the same JSON lines to stdout: assign, revoke, lost
// (partition lists), msg (p, o, v: logged before the record is processed), commit
// (offsets as committed, only those the broker accepted), commit_failed, error;
// each with "t", wall-clock seconds. BALANCER is cooperative-sticky (franz-go's
// default), range (eager) or server (KIP-848: kgo.ServerSideBalancer, the broker
// assigns). Processing = log, sleep DELAY_MS; after each poll of up to 20
// records it commits, synchronously and before allowing a rebalance
// (kgo.BlockRebalanceOnPoll), the next offset of every partition processed and
// not yet committed. A commit that fails is tried again after the next poll, or
// in the revoke callback for partitions being taken away (partitions lost are
// forgotten). SIGTERM: leave the group (revoking and committing), close, exit 0.
//
//	franzcheck offsets BOOTSTRAP GROUP TOPIC
//
// What kadm says about a group, as one JSON object: FetchOffsets (offset and
// metadata per partition), DescribeGroups (state, protocol type and name,
// members with their client ids and assigned partitions of TOPIC) and Lag
// (committed, end and lag per partition of TOPIC).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

var logMu sync.Mutex

func logEvent(ev string, fields map[string]any) {
	if fields == nil {
		fields = map[string]any{}
	}
	fields["ev"] = ev
	fields["t"] = float64(time.Now().UnixNano()) / 1e9
	line, _ := json.Marshal(fields)
	logMu.Lock()
	defer logMu.Unlock()
	os.Stdout.Write(append(line, '\n'))
}

func partitionsOf(m map[string][]int32, topic string) []int32 {
	ps := append([]int32{}, m[topic]...)
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	return ps
}

// pendingOffsets are offsets processed but not yet committed, shared by the poll
// loop and the rebalance callbacks.
type pendingOffsets struct {
	mu      sync.Mutex
	offsets map[int32]kgo.EpochOffset
}

func (p *pendingOffsets) set(partition int32, o kgo.EpochOffset) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.offsets[partition] = o
}

func (p *pendingOffsets) forget(partitions []int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, partition := range partitions {
		delete(p.offsets, partition)
	}
}

// commit commits the pending offsets (of only these partitions, if only is not
// nil), synchronously, logs what the broker accepted and forgets those.
func (p *pendingOffsets) commit(cl *kgo.Client, topic string, only []int32) {
	p.mu.Lock()
	next := map[int32]kgo.EpochOffset{}
	for partition, o := range p.offsets {
		if only == nil || contains(only, partition) {
			next[partition] = o
		}
	}
	p.mu.Unlock()
	if len(next) == 0 {
		return
	}
	// A bound of its own, so that SIGTERM does not cancel a commit half-way.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cl.CommitOffsetsSync(ctx, map[string]map[int32]kgo.EpochOffset{topic: next},
		func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			if err != nil {
				logEvent("commit_failed", map[string]any{"error": err.Error()})
				return
			}
			ok := map[string]int64{}
			var bad []string
			p.mu.Lock()
			defer p.mu.Unlock()
			for _, t := range resp.Topics {
				for _, r := range t.Partitions {
					sent, found := next[r.Partition]
					if e := kerr.ErrorForCode(r.ErrorCode); e != nil {
						bad = append(bad, fmt.Sprintf("%d: %v", r.Partition, e))
					} else if found {
						ok[strconv.Itoa(int(r.Partition))] = sent.Offset
						if p.offsets[r.Partition] == sent {
							delete(p.offsets, r.Partition)
						}
					}
				}
			}
			if len(ok) > 0 {
				logEvent("commit", map[string]any{"offsets": ok})
			}
			if len(bad) > 0 {
				logEvent("commit_failed", map[string]any{"error": fmt.Sprint(bad)})
			}
		})
}

func contains(ps []int32, p int32) bool {
	for _, x := range ps {
		if x == p {
			return true
		}
	}
	return false
}

// untilSignalled is a context cancelled by SIGTERM or SIGINT: the member finishes what it
// is doing and leaves its group cleanly.
func untilSignalled() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		cancel()
	}()
	return ctx, cancel
}

func runGroup(bootstrap, group, topic, balancer string, delayMs int) error {
	pending := &pendingOffsets{offsets: map[int32]kgo.EpochOffset{}}
	ctx, cancel := untilSignalled()
	defer cancel()

	opts := []kgo.Opt{
		kgo.SeedBrokers(bootstrap),
		kgo.ClientID("franz-group-" + balancer),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.SessionTimeout(6 * time.Second),
		kgo.HeartbeatInterval(time.Second),
		kgo.RebalanceTimeout(20 * time.Second),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			logEvent("assign", map[string]any{"partitions": partitionsOf(m, topic)})
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, cl *kgo.Client, m map[string][]int32) {
			revoked := partitionsOf(m, topic)
			logEvent("revoke", map[string]any{"partitions": revoked})
			if len(revoked) > 0 {
				pending.commit(cl, topic, revoked)
				pending.forget(revoked)
			}
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			lost := partitionsOf(m, topic)
			logEvent("lost", map[string]any{"partitions": lost})
			pending.forget(lost)
		}),
	}
	switch balancer {
	case "cooperative-sticky":
		opts = append(opts, kgo.Balancers(kgo.CooperativeStickyBalancer()))
	case "range":
		opts = append(opts, kgo.Balancers(kgo.RangeBalancer()))
	case "server":
		opts = append(opts, kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.ServerSideBalancer())
	default:
		return fmt.Errorf("unknown balancer %q", balancer)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	logEvent("start", nil)

	delay := time.Duration(delayMs) * time.Millisecond
	for ctx.Err() == nil {
		pollCtx, pollCancel := context.WithTimeout(ctx, 500*time.Millisecond)
		fetches := cl.PollRecords(pollCtx, 20)
		pollCancel()
		fetches.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				logEvent("error", map[string]any{"error": fmt.Sprintf("%s[%d]: %v", t, p, err)})
			}
		})
		fetches.EachRecord(func(r *kgo.Record) {
			logEvent("msg", map[string]any{"p": r.Partition, "o": r.Offset, "v": string(r.Value)})
			time.Sleep(delay)
			pending.set(r.Partition, kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset + 1})
		})
		pending.commit(cl, topic, nil)
		cl.AllowRebalance()
	}
	cl.Close() // leaves the group
	logEvent("closed", nil)
	return nil
}

type fetchedOffset struct {
	Offset   int64  `json:"offset"`
	Metadata string `json:"metadata"`
}

type describedMember struct {
	MemberID   string  `json:"member_id"`
	ClientID   string  `json:"client_id"`
	InstanceID *string `json:"instance_id"`
	Partitions []int32 `json:"partitions"`
}

type partitionLag struct {
	Committed int64 `json:"committed"`
	End       int64 `json:"end"`
	Lag       int64 `json:"lag"`
}

type groupReport struct {
	Offsets      map[string]fetchedOffset `json:"offsets"`
	State        string                   `json:"state"`
	ProtocolType string                   `json:"protocol_type"`
	Protocol     string                   `json:"protocol"`
	Members      []describedMember        `json:"members"`
	Lag          map[string]partitionLag  `json:"lag"`
}

func runOffsets(bootstrap, group, topic string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(bootstrap))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)

	rep := groupReport{Offsets: map[string]fetchedOffset{}, Lag: map[string]partitionLag{}, Members: []describedMember{}}
	fetched, err := adm.FetchOffsets(ctx, group)
	if err == nil {
		err = fetched.Error()
	}
	if err != nil {
		return fmt.Errorf("fetch offsets: %w", err)
	}
	fetched.Each(func(o kadm.OffsetResponse) {
		if o.Topic == topic {
			rep.Offsets[strconv.Itoa(int(o.Partition))] = fetchedOffset{Offset: o.At, Metadata: o.Metadata}
		}
	})

	described, err := adm.DescribeGroups(ctx, group)
	if err == nil {
		err = described.Error()
	}
	if err != nil {
		return fmt.Errorf("describe groups: %w", err)
	}
	d := described[group]
	rep.State, rep.ProtocolType, rep.Protocol = d.State, d.ProtocolType, d.Protocol
	for _, m := range d.Members {
		dm := describedMember{MemberID: m.MemberID, ClientID: m.ClientID, InstanceID: m.InstanceID, Partitions: []int32{}}
		if a, ok := m.Assigned.AsConsumer(); ok {
			for _, t := range a.Topics {
				if t.Topic == topic {
					dm.Partitions = append(dm.Partitions, t.Partitions...)
				}
			}
		}
		sort.Slice(dm.Partitions, func(i, j int) bool { return dm.Partitions[i] < dm.Partitions[j] })
		rep.Members = append(rep.Members, dm)
	}
	sort.Slice(rep.Members, func(i, j int) bool { return rep.Members[i].ClientID < rep.Members[j].ClientID })

	lags, err := adm.Lag(ctx, group)
	if err != nil {
		return fmt.Errorf("lag: %w", err)
	}
	dl := lags[group]
	if dl.Error() != nil {
		return fmt.Errorf("lag: %w", dl.Error())
	}
	for _, l := range dl.Lag.Sorted() {
		if l.Topic != topic {
			continue
		}
		if l.Err != nil {
			return fmt.Errorf("lag of %s[%d]: %w", l.Topic, l.Partition, l.Err)
		}
		rep.Lag[strconv.Itoa(int(l.Partition))] = partitionLag{Committed: l.Commit.At, End: l.End.Offset, Lag: l.Lag}
	}

	out, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(append(out, '\n'))
	return err
}

// groupMain runs a subcommand other than the round trip (those above, and "eos"
// of txn.go); ok is false when os.Args names none.
func groupMain() (ok bool, err error) {
	if len(os.Args) < 2 {
		return false, nil
	}
	switch os.Args[1] {
	case "group":
		if len(os.Args) != 7 {
			return true, errors.New("usage: franzcheck group BOOTSTRAP GROUP TOPIC BALANCER DELAY_MS")
		}
		delay, err := strconv.Atoi(os.Args[6])
		if err != nil {
			return true, fmt.Errorf("DELAY_MS: %w", err)
		}
		return true, runGroup(os.Args[2], os.Args[3], os.Args[4], os.Args[5], delay)
	case "offsets":
		if len(os.Args) != 5 {
			return true, errors.New("usage: franzcheck offsets BOOTSTRAP GROUP TOPIC")
		}
		return true, runOffsets(os.Args[2], os.Args[3], os.Args[4])
	case "eos":
		if len(os.Args) != 11 {
			return true, errors.New("usage: franzcheck eos BOOTSTRAP GROUP IN_TOPIC OUT_TOPIC TXN_ID BATCH DELAY_MS INIT CRASH")
		}
		batch, err := strconv.Atoi(os.Args[7])
		if err != nil || batch < 1 {
			return true, fmt.Errorf("BATCH %q: want a positive count", os.Args[7])
		}
		delay, err := strconv.Atoi(os.Args[8])
		if err != nil {
			return true, fmt.Errorf("DELAY_MS: %w", err)
		}
		return true, runEOS(os.Args[2], os.Args[3], os.Args[4], os.Args[5], os.Args[6], batch, delay, os.Args[9], os.Args[10])
	}
	return false, nil
}
