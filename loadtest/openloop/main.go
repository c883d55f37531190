// openloop: a constant-arrival-rate load generator for qstate's router and for Redis, the
// same schedule for both (docs/architecture.md §8). Request i is due at start + i/rate,
// whether or not earlier ones have been answered (open loop: queueing delay counts), and
// its latency is measured from when it was due, not from when it was sent, so a stalled
// server cannot hide its stall by slowing the sender (coordinated omission).
//
//	openloop -http http://127.0.0.1:8000/v1/state/tweets/per_tweet_1h/impressions/ \
//	         -keys keys.txt -rate 2000 -duration 60s
//	openloop -redis 127.0.0.1:6379 -prefix "tw:" -keys keys.txt -rate 2000 -duration 60s
//
// Prints one JSON object: offered and achieved rate, answers by kind, p50/p90/p99/p999/max
// in ms. Exit codes: 0 ran; 2 bad flags or an unreadable key file.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

type result struct {
	Target      string  `json:"target"`
	OfferedRate float64 `json:"offered_rate"`
	Achieved    float64 `json:"achieved_rate"`
	Sent        int     `json:"sent"`
	OK          int     `json:"ok"`
	Missing     int     `json:"missing"` // 404 / nil: the key has no value (yet)
	Errors      int     `json:"errors"`  // anything else: a 5xx, a refused or dropped call
	Overflow    int     `json:"overflow"`
	P50         float64 `json:"p50_ms"`
	P90         float64 `json:"p90_ms"`
	P99         float64 `json:"p99_ms"`
	P999        float64 `json:"p999_ms"`
	Max         float64 `json:"max_ms"`
}

type outcome int

const (
	ok outcome = iota
	missing
	failed
)

func readKeys(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var keys []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		if line := s.Text(); line != "" {
			keys = append(keys, line)
		}
	}
	return keys, s.Err()
}

func quantile(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q * float64(len(sorted)-1))
	return float64(sorted[i].Microseconds()) / 1000
}

func main() {
	httpURL := flag.String("http", "", "URL prefix a key is appended to (GET)")
	redisAddr := flag.String("redis", "", "host:port of a Redis to GET keys from")
	prefix := flag.String("prefix", "", "Redis: prefix of every key")
	keysPath := flag.String("keys", "", "file of keys, one a line (required)")
	rate := flag.Float64("rate", 2000, "requests a second, at constant intervals")
	duration := flag.Duration("duration", 60*time.Second, "how long to send")
	maxInFlight := flag.Int("max-in-flight", 4096, "requests outstanding at once; beyond it a "+
		"due request is counted as overflow (an error), never delayed")
	timeout := flag.Duration("timeout", 5*time.Second, "per request")
	seed := flag.Uint64("seed", 1, "key choice")
	flag.Parse()
	if (*httpURL == "") == (*redisAddr == "") || *keysPath == "" || *rate <= 0 {
		fmt.Fprintln(os.Stderr, "openloop: give -keys and one of -http or -redis, and -rate > 0")
		flag.Usage()
		os.Exit(2)
	}
	keys, err := readKeys(*keysPath)
	if err != nil || len(keys) == 0 {
		fmt.Fprintf(os.Stderr, "openloop: cannot read keys from %s: %v\n", *keysPath, err)
		os.Exit(2)
	}

	var get func(ctx context.Context, key string) outcome
	target := *httpURL
	if *httpURL != "" {
		client := &http.Client{Timeout: *timeout, Transport: &http.Transport{
			MaxIdleConns: *maxInFlight, MaxIdleConnsPerHost: *maxInFlight}}
		get = func(ctx context.Context, key string) outcome {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, *httpURL+key, nil)
			resp, err := client.Do(req)
			if err != nil {
				return failed
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch {
			case resp.StatusCode == http.StatusOK:
				return ok
			case resp.StatusCode == http.StatusNotFound:
				return missing
			}
			return failed
		}
	} else {
		target = "redis://" + *redisAddr
		rdb := redis.NewClient(&redis.Options{Addr: *redisAddr, PoolSize: *maxInFlight,
			ReadTimeout: *timeout, WriteTimeout: *timeout})
		get = func(ctx context.Context, key string) outcome {
			err := rdb.Get(ctx, *prefix+key).Err()
			switch {
			case err == nil:
				return ok
			case err == redis.Nil:
				return missing
			}
			return failed
		}
	}

	n := int(*rate * duration.Seconds())
	latencies := make([]time.Duration, n)
	outcomes := make([]outcome, n)
	sent := make([]bool, n)
	slots := make(chan struct{}, *maxInFlight)
	rng := rand.New(rand.NewPCG(*seed, 0))
	interval := time.Duration(float64(time.Second) / *rate)
	// SIGINT/SIGTERM end the schedule early: what was sent is waited for and reported
	stop, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < n; i++ {
		due := start.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			select {
			case <-time.After(d):
			case <-stop.Done():
			}
		}
		if stop.Err() != nil {
			n = i
			break
		}
		key := keys[rng.IntN(len(keys))]
		select {
		case slots <- struct{}{}:
		default:
			outcomes[i] = failed // over max-in-flight: counted, not queued
			continue
		}
		sent[i] = true
		wg.Add(1)
		go func(i int, due time.Time, key string) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), *timeout)
			outcomes[i] = get(ctx, key)
			cancel()
			latencies[i] = time.Since(due)
			<-slots
		}(i, due, key)
	}
	elapsed := time.Since(start)
	wg.Wait()

	r := result{Target: target, OfferedRate: *rate, Achieved: float64(n) / elapsed.Seconds()}
	var answered []time.Duration
	for i := 0; i < n; i++ {
		if !sent[i] {
			r.Overflow++
		} else {
			r.Sent++
			answered = append(answered, latencies[i])
		}
		switch outcomes[i] {
		case ok:
			r.OK++
		case missing:
			r.Missing++
		default:
			r.Errors++
		}
	}
	sort.Slice(answered, func(a, b int) bool { return answered[a] < answered[b] })
	r.P50, r.P90, r.P99 = quantile(answered, 0.5), quantile(answered, 0.9), quantile(answered, 0.99)
	r.P999, r.Max = quantile(answered, 0.999), quantile(answered, 1)
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
}
