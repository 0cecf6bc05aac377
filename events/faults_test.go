package events

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// relayChildEnv set makes the test binary a relay (see TestMain): a relay
// the test can kill -9. FS_RELAY_KILL_AFTER_ACK=n makes it kill itself
// with SIGKILL once its n-th produce is acknowledged, before the mark.
const relayChildEnv = "FLASHSALE_TEST_RELAY_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(relayChildEnv) != "" {
		os.Exit(runRelayChild())
	}
	testenv.Main(m)
}

func runRelayChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "relay child:", err)
		return 1
	}
	pool, err := pgxpool.New(ctx, os.Getenv("FS_RELAY_DATABASE_URL"))
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	killAfter, _ := strconv.Atoi(os.Getenv("FS_RELAY_KILL_AFTER_ACK"))
	acks := 0
	// One event a produce: a relay told to kill itself at its n-th
	// acknowledgement needs n events, which is what the test makes sure
	// are there. With 4 a produce, 3 events were one acknowledgement,
	// and a relay waiting for its third never reached it.
	r, err := NewRelay(RelayConfig{
		Brokers: strings.Split(os.Getenv("FS_RELAY_BROKERS"), ","), Batch: 1, Interval: 10 * time.Millisecond,
		afterProduce: func() error {
			acks++
			if killAfter > 0 && acks == killAfter {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the signal is on its way
			}
			return nil
		},
	}, pool, nil, nil)
	if err != nil {
		return fail(err)
	}
	if err := r.Run(ctx); err != nil {
		return fail(err)
	}
	return 0
}

// relayProcess is a relay in a child process.
type relayProcess struct {
	cmd  *exec.Cmd
	done chan error
}

func startRelayProcess(t *testing.T, dbURL string, brokers []string, killAfterAck int) *relayProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), relayChildEnv+"=1",
		"FS_RELAY_DATABASE_URL="+dbURL,
		"FS_RELAY_BROKERS="+strings.Join(brokers, ","),
		"FS_RELAY_KILL_AFTER_ACK="+strconv.Itoa(killAfterAck))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &relayProcess{cmd: cmd, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	return p
}

func publishedCount(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM order_events WHERE published_at IS NOT NULL`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The relay, a real process, is killed with SIGKILL at random points of a
// stream of order changes, several times, half of them right after Kafka
// acknowledged a produce and before the mark; restarted each time. The
// topic then carries every event exactly once, each order's in id order.
func TestRelayKilledAndRestarted(t *testing.T) {
	if testing.Short() {
		t.Skip("runs relay processes")
	}
	t.Parallel()
	dbURL := testenv.DurableDatabaseURL(t) // commits wait for the WAL
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	k := testenv.NewKafka(t)

	// The stream: 40 orders, each going through 6 changes, interleaved.
	const orders, changes = 40, 6
	ids := make([]string, orders)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	// The last change of every order is held back and appended by the
	// test itself: a relay that kills itself after its first
	// acknowledgements needs events left to publish, and on a fast
	// machine the earlier rounds can publish the whole stream.
	var fed atomic.Int64
	var fedAll atomic.Bool // the stream but the held-back changes is in
	feedDone := make(chan error, 1)
	appendEvent := func(ctx context.Context, c, i int) error {
		st := lifecycle[c%len(lifecycle)]
		ev := Event{Type: TypeFor(st), OccurredAt: time.Now(), OrderID: ids[i], SaleID: 1, ItemID: 1001,
			UserID: int64(i + 1), Status: st, PriceCents: 100}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return Append(ctx, tx, ev) }); err != nil {
			return err
		}
		fed.Add(1)
		return nil
	}
	held := 0 // orders whose last change is appended
	appendHeld := func(n int) {
		t.Helper()
		for ; n > 0 && held < orders; n-- {
			if err := appendEvent(context.Background(), changes-1, held); err != nil {
				t.Fatal(err)
			}
			held++
		}
	}
	go func() {
		ctx := context.Background()
		for c := range changes - 1 {
			for i := range ids {
				if err := appendEvent(ctx, c, i); err != nil {
					feedDone <- err
					return
				}
				if i%8 == 0 {
					time.Sleep(time.Millisecond) // a stream, not one burst
				}
			}
		}
		fedAll.Store(true)
		feedDone <- nil
	}()

	selfKills := 0
	for round := range 8 {
		// Every round's relay needs events to publish: one killed by
		// itself after up to three acknowledgements needs three, one
		// killed from outside at least one more. No relay runs between
		// rounds, so what is unpublished now stays so until it starts.
		testenv.Eventually(t, fmt.Sprintf("round %d: events to publish", round), 60*time.Second, func() bool {
			return unpublished(t, pool) >= 3 || fedAll.Load()
		})
		if unpublished(t, pool) < 3 {
			appendHeld(10)
		}
		if round%2 == 0 {
			// Killed by itself between the acknowledgement and the mark.
			p := startRelayProcess(t, dbURL, k.Brokers, 1+rand.IntN(3))
			select {
			case err := <-p.done:
				if ee, ok := err.(*exec.ExitError); !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
					t.Fatalf("round %d: relay ended with %v, want its own SIGKILL", round, err)
				}
				selfKills++
			case <-time.After(60 * time.Second):
				t.Fatalf("round %d: relay did not reach its kill point", round)
			}
			p.done <- nil // for the cleanup
			continue
		}
		// Killed from outside once it published a random number more.
		before := publishedCount(t, pool)
		p := startRelayProcess(t, dbURL, k.Brokers, 0)
		more := 1 + rand.IntN(12)
		waitFor(t, fmt.Sprintf("round %d: %d more published", round, more), func() bool {
			return publishedCount(t, pool) >= min(before+more, int(fed.Load())) && publishedCount(t, pool) > before
		})
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-p.done
		p.done <- nil
	}
	if err := <-feedDone; err != nil {
		t.Fatal(err)
	}
	appendHeld(orders)
	// A last relay finishes the stream.
	last := startRelayProcess(t, dbURL, k.Brokers, 0)
	waitFor(t, "every event published", func() bool { return unpublished(t, pool) == 0 })
	_ = last.cmd.Process.Signal(syscall.SIGTERM)
	<-last.done
	last.done <- nil

	recs := readTopic(t, k.Brokers)
	checkExactlyOnce(t, pool, recs)
	if got, want := len(recs), orders*changes; got != want {
		t.Errorf("%d records, want %d", got, want)
	}
	if selfKills < 4 {
		t.Errorf("%d kills between acknowledgement and mark, want 4", selfKills)
	}
}
