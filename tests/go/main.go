// Command franzcheck drives the round trip of tests/roundtrip.py with franz-go.
//
// Usage: franzcheck BOOTSTRAP SPEC_JSON RESULT_JSON
//
// (group.go adds the consumer-group subcommands "group" and "offsets", txn.go the
// exactly-once pipeline member "eos".)
//
// It creates the spec's topic with kadm, produces each compression group with its
// own kgo client (idempotent, acks=all, manual partitioning, explicit timestamps)
// and waits for every ack before the next group, reads every partition from the
// beginning with ConsumePartitions (direct assignment, no group), answers the
// timestamp look-ups with kadm.ListOffsetsAfterMilli and writes what it saw to
// RESULT_JSON. It judges nothing; the Python test compares. Any client error exits
// non-zero with the error on stderr.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// deadline bounds the whole run; the Python side has its own timeout on top.
const deadline = 120 * time.Second

type specRecord struct {
	Partition int32       `json:"partition"`
	Key       *string     `json:"key"`
	Value     *string     `json:"value"`
	Headers   [][]*string `json:"headers"`
	Timestamp int64       `json:"timestamp"`
}

type spec struct {
	Topic      string `json:"topic"`
	Partitions int32  `json:"partitions"`
	Groups     []struct {
		Compression string       `json:"compression"`
		Records     []specRecord `json:"records"`
	} `json:"groups"`
	TimeQueries []struct {
		Partition int32 `json:"partition"`
		Timestamp int64 `json:"timestamp"`
	} `json:"time_queries"`
}

type ack struct {
	Partition int32 `json:"partition"`
	Offset    int64 `json:"offset"`
}

type record struct {
	Partition int32       `json:"partition"`
	Offset    int64       `json:"offset"`
	Timestamp int64       `json:"timestamp"`
	Key       *string     `json:"key"`
	Value     *string     `json:"value"`
	Headers   [][]*string `json:"headers"`
}

type answer struct {
	Partition int32  `json:"partition"`
	Timestamp int64  `json:"timestamp"`
	Offset    *int64 `json:"offset"`
}

type result struct {
	Acks         []ack            `json:"acks"`
	StartOffsets map[string]int64 `json:"start_offsets"`
	EndOffsets   map[string]int64 `json:"end_offsets"`
	Records      []record         `json:"records"`
	TimeQueries  []answer         `json:"time_queries"`
}

func main() {
	if ran, err := groupMain(); ran {
		if err != nil {
			fmt.Fprintln(os.Stderr, "franzcheck:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: franzcheck BOOTSTRAP SPEC_JSON RESULT_JSON")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2], os.Args[3]); err != nil {
		fmt.Fprintln(os.Stderr, "franzcheck:", err)
		os.Exit(1)
	}
}

func run(bootstrap, specPath, resultPath string) error {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()

	raw, err := os.ReadFile(specPath)
	if err != nil {
		return err
	}
	var s spec
	if err := json.Unmarshal(raw, &s); err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	res := result{StartOffsets: map[string]int64{}, EndOffsets: map[string]int64{}}

	admin, err := kgo.NewClient(kgo.SeedBrokers(bootstrap))
	if err != nil {
		return err
	}
	defer admin.Close()
	adm := kadm.NewClient(admin)
	created, err := adm.CreateTopic(ctx, s.Partitions, 1, nil, s.Topic)
	if err != nil {
		return fmt.Errorf("create topic: %w", err)
	}
	if created.Err != nil {
		return fmt.Errorf("create topic: %w", created.Err)
	}

	for _, g := range s.Groups {
		acks, err := produceGroup(ctx, bootstrap, s.Topic, g.Compression, g.Records)
		if err != nil {
			return fmt.Errorf("produce %s: %w", g.Compression, err)
		}
		res.Acks = append(res.Acks, acks...)
	}

	starts, err := adm.ListStartOffsets(ctx, s.Topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return fmt.Errorf("list start offsets: %w", err)
	}
	ends, err := adm.ListEndOffsets(ctx, s.Topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fmt.Errorf("list end offsets: %w", err)
	}
	end := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		end[o.Partition] = o.Offset
		res.EndOffsets[strconv.Itoa(int(o.Partition))] = o.Offset
	})
	starts.Each(func(o kadm.ListedOffset) {
		res.StartOffsets[strconv.Itoa(int(o.Partition))] = o.Offset
	})

	if res.Records, err = consumeAll(ctx, bootstrap, s.Topic, end); err != nil {
		return fmt.Errorf("consume: %w", err)
	}

	for _, q := range s.TimeQueries {
		listed, err := adm.ListOffsetsAfterMilli(ctx, q.Timestamp, s.Topic)
		if err == nil {
			err = listed.Error()
		}
		if err != nil {
			return fmt.Errorf("list offsets after %d: %w", q.Timestamp, err)
		}
		o, ok := listed.Lookup(s.Topic, q.Partition)
		if !ok {
			return fmt.Errorf("list offsets after %d: partition %d missing", q.Timestamp, q.Partition)
		}
		a := answer{Partition: q.Partition, Timestamp: q.Timestamp}
		// Kafka answers -1 when no record has a timestamp at or after the query;
		// kadm then asks again for the end offset and returns that instead. Both
		// mean "nothing there", which the result spells as null.
		if o.Offset >= 0 && o.Offset != end[q.Partition] {
			off := o.Offset
			a.Offset = &off
		}
		res.TimeQueries = append(res.TimeQueries, a)
	}

	out, err := json.Marshal(res)
	if err != nil {
		return err
	}
	return os.WriteFile(resultPath, out, 0o644)
}

func codec(name string) (kgo.CompressionCodec, error) {
	switch name {
	case "none":
		return kgo.NoCompression(), nil
	case "gzip":
		return kgo.GzipCompression(), nil
	case "snappy":
		return kgo.SnappyCompression(), nil
	case "lz4":
		return kgo.Lz4Compression(), nil
	case "zstd":
		return kgo.ZstdCompression(), nil
	}
	return kgo.CompressionCodec{}, fmt.Errorf("unknown codec %q", name)
}

// produceGroup sends records with one idempotent client and returns their acks in
// the order the records were given.
func produceGroup(ctx context.Context, bootstrap, topic, compression string, records []specRecord) ([]ack, error) {
	c, err := codec(compression)
	if err != nil {
		return nil, err
	}
	// Idempotence is franz-go's default; acks=all is required for it.
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(bootstrap),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerBatchCompression(c),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(5*time.Millisecond),
	)
	if err != nil {
		return nil, err
	}
	defer cl.Close()

	acks := make([]ack, len(records))
	var mu sync.Mutex
	var firstErr error
	for i, r := range records {
		rec := &kgo.Record{
			Topic:     topic,
			Partition: r.Partition,
			Key:       bytesOf(r.Key),
			Value:     bytesOf(r.Value),
			Timestamp: time.UnixMilli(r.Timestamp),
		}
		for _, h := range r.Headers {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: *h[0], Value: bytesOf(h[1])})
		}
		i := i
		cl.Produce(ctx, rec, func(r *kgo.Record, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			acks[i] = ack{Partition: r.Partition, Offset: r.Offset}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	return acks, firstErr
}

func consumeAll(ctx context.Context, bootstrap, topic string, end map[int32]int64) ([]record, error) {
	assign := map[int32]kgo.Offset{}
	for p := range end {
		assign[p] = kgo.NewOffset().AtStart()
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(bootstrap),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: assign}),
	)
	if err != nil {
		return nil, err
	}
	defer cl.Close()

	next := map[int32]int64{}
	var out []record
	caughtUp := func() bool {
		for p, e := range end {
			if next[p] < e {
				return false
			}
		}
		return true
	}
	for !caughtUp() {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("read up to %v, wanted %v: %w", next, end, ctx.Err())
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			return nil, fmt.Errorf("fetch: %v", errs[0].Err)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			rec := record{
				Partition: r.Partition,
				Offset:    r.Offset,
				Timestamp: r.Timestamp.UnixMilli(),
				Key:       textOf(r.Key),
				Value:     textOf(r.Value),
				Headers:   [][]*string{},
			}
			for _, h := range r.Headers {
				k := h.Key
				rec.Headers = append(rec.Headers, []*string{&k, textOf(h.Value)})
			}
			out = append(out, rec)
			next[r.Partition] = r.Offset + 1
		})
	}
	return out, nil
}

func bytesOf(s *string) []byte {
	if s == nil {
		return nil
	}
	return []byte(*s)
}

// textOf keeps Kafka's null apart from an empty byte string: franz-go decodes
// null as a nil slice and empty as a non-nil one.
func textOf(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}
