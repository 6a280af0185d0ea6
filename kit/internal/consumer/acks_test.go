package consumer

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
)

// fate is what a test does with one delivery.
type fate int

const (
	fateAck     fate = iota // acked through the acker, in a batch
	fateSettled             // nacked or rejected singly, then reported
	fateLeft                // left unsettled, for the broker to redeliver
)

// settleStep is one settling call: a batch of acks, or one delivery settled otherwise.
type settleStep struct {
	acks  []uint64
	other uint64
}

// plan gives n deliveries their fates (about 3% settled otherwise; some of the
// last 5% left, as a session's end leaves them) and the steps that settle
// them: batches of 1 to 12 nearby acks and the single settles, in the tags'
// order but for neighbours, which come in any order (several committers and
// workers finish close together).
func plan(rng *rand.Rand, n int) (fates []fate, steps []settleStep) {
	fates = make([]fate, n+1)
	var batch []uint64
	flush := func() {
		if len(batch) > 0 {
			rng.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
			steps = append(steps, settleStep{acks: batch})
			batch = nil
		}
	}
	for tag := 1; tag <= n; tag++ {
		switch p := rng.IntN(100); {
		case p < 20 && tag > n*95/100:
			fates[tag] = fateLeft
		case p < 3:
			fates[tag] = fateSettled
			steps = append(steps, settleStep{other: uint64(tag)})
		default:
			batch = append(batch, uint64(tag))
			if rng.IntN(12) == 0 {
				flush()
			}
		}
	}
	flush()
	for i := 0; i < len(steps); i += 4 {
		w := steps[i:min(i+4, len(steps))]
		rng.Shuffle(len(w), func(i, j int) { w[i], w[j] = w[j], w[i] })
	}
	return fates, steps
}

// TestAckerSettlesEachDeliveryOnceAndNeverPastAnUnsettledOne holds the acker
// to the broker's rules, modelled: a single ack or a multiple ack's own tag
// must be unacked, and a multiple ack settles every unacked tag up to its own,
// so it must never reach a delivery that was left unsettled or that is still
// to be acked by another batch.
func TestAckerSettlesEachDeliveryOnceAndNeverPastAnUnsettledOne(t *testing.T) {
	t.Parallel()
	for seed := range uint64(20) {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			const n = 3000
			fates, steps := plan(rng, n)
			var mu sync.Mutex
			unacked := make(map[uint64]bool, n) // the broker's view
			for tag := uint64(1); tag <= n; tag++ {
				unacked[tag] = true
			}
			acked := make(map[uint64]bool) // settled by an ack, single or multiple
			frames := 0
			send := func(tag uint64, multiple bool) error {
				mu.Lock()
				defer mu.Unlock()
				frames++
				if !unacked[tag] {
					return fmt.Errorf("PRECONDITION_FAILED - unknown delivery tag %d", tag)
				}
				if !multiple {
					delete(unacked, tag)
					acked[tag] = true
					return nil
				}
				for t := range unacked {
					if t <= tag {
						delete(unacked, t)
						acked[t] = true
					}
				}
				return nil
			}
			a := newAcker(send, time.Hour, func(err error, _ int) { t.Errorf("held acks failed: %v", err) })
			jobs := make(chan settleStep)
			errs := make(chan error, len(steps))
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					for st := range jobs {
						if st.acks != nil {
							errs <- a.ack(st.acks...)
							continue
						}
						mu.Lock()
						delete(unacked, st.other) // the nack or reject, sent
						mu.Unlock()
						a.settled(st.other)
					}
				})
			}
			for _, st := range steps {
				jobs <- st
			}
			close(jobs)
			wg.Wait()
			a.close() // the held acks: those above a delivery left unsettled
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			nAck := 0
			for tag := 1; tag <= n; tag++ {
				switch fates[tag] {
				case fateAck:
					nAck++
					if !acked[uint64(tag)] {
						t.Errorf("delivery %d was to be acked and is not", tag)
					}
				case fateLeft:
					if !unacked[uint64(tag)] {
						t.Errorf("delivery %d was left unsettled, and a multiple ack settled it", tag)
					}
				case fateSettled:
					if acked[uint64(tag)] {
						t.Errorf("delivery %d was nacked, and acked too", tag)
					}
				}
			}
			// Coalescing must do something, or it is only a cost: at most one frame
			// for two acks here.
			if frames*2 > nAck {
				t.Errorf("%d ack frames for %d acked deliveries: nothing coalesced", frames, nAck)
			}
		})
	}
}

// sentAcks records what an acker sends.
type sentAcks struct {
	mu    sync.Mutex
	sends []string
}

func (r *sentAcks) send(tag uint64, multiple bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if multiple {
		r.sends = append(r.sends, fmt.Sprintf("%d+", tag))
	} else {
		r.sends = append(r.sends, strconv.FormatUint(tag, 10))
	}
	return nil
}

func (r *sentAcks) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprint(r.sends)
}

// TestAckerHoldsAnAckForTheLowerOnesThenSendsItAlone: an ack above an
// unsettled delivery waits for it for the hold, joins its multiple ack if it
// comes, and is sent alone if it does not.
func TestAckerHoldsAnAckForTheLowerOnesThenSendsItAlone(t *testing.T) {
	t.Parallel()
	var r sentAcks
	a := newAcker(r.send, time.Hour, func(err error, _ int) { t.Error(err) })
	if err := a.ack(3, 2); err != nil {
		t.Fatal(err)
	}
	if got := r.String(); got != "[]" {
		t.Fatalf("sent %s before delivery 1 was settled, want nothing yet", got)
	}
	if err := a.ack(1); err != nil {
		t.Fatal(err)
	}
	if got := r.String(); got != "[3+]" {
		t.Fatalf("sent %s, want one multiple ack of 1 to 3", got)
	}
	a.settled(5)                     // rejected, say
	if err := a.ack(4); err != nil { // reaches 5: next is 6
		t.Fatal(err)
	}
	if err := a.ack(7); err != nil {
		t.Fatal(err)
	}
	a.settled(6)
	if got := r.String(); got != "[3+ 4+ 7+]" {
		t.Fatalf("sent %s, want multiple acks up to 4, then up to 7 once 6 was settled", got)
	}

	var alone sentAcks
	b := newAcker(alone.send, 20*time.Millisecond, func(err error, _ int) { t.Error(err) })
	if err := b.ack(2, 3); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "the held acks sent alone", func() (bool, error) {
		got := alone.String()
		return got == "[2 3]" || got == "[3 2]", nil
	})
	if err := b.ack(1); err != nil { // 2 and 3 are settled: a multiple ack of 1 alone
		t.Fatal(err)
	}
	if got := alone.String(); got != "[2 3 1+]" && got != "[3 2 1+]" {
		t.Fatalf("sent %s, want 2 and 3 alone, then 1", got)
	}
}

// TestAckerFallsBackToSingleAcksPastItsLimit: a delivery left unsettled early
// in a long session must not make the acker keep every later tag.
func TestAckerFallsBackToSingleAcksPastItsLimit(t *testing.T) {
	t.Parallel()
	var singles, multiples int
	a := newAcker(func(_ uint64, multiple bool) error {
		if multiple {
			multiples++
		} else {
			singles++
		}
		return nil
	}, time.Hour, func(err error, _ int) { t.Error(err) })
	// Tag 1 is never settled: every later ack is held, then sent alone.
	for tag := uint64(2); tag <= ackerLimit+10; tag++ {
		if err := a.ack(tag); err != nil {
			t.Fatal(err)
		}
	}
	if multiples != 0 || singles != ackerLimit+9 {
		t.Fatalf("%d multiple and %d single acks, want 0 and %d", multiples, singles, ackerLimit+9)
	}
	if !a.off || a.above != nil {
		t.Fatalf("past %d kept tags the acker still keeps them (off=%v, %d kept)", ackerLimit, a.off, len(a.above))
	}
	a.settled(1) // no effect once off
	if err := a.ack(ackerLimit+20, ackerLimit+21); err != nil || multiples != 0 || singles != ackerLimit+11 {
		t.Fatalf("after the fallback: err %v, %d multiple and %d single acks", err, multiples, singles)
	}
}

// TestCoalescedAcksSettleExactlyWhatWasAckedOnTheBroker runs the acker on a
// real channel: 400 deliveries in flight at once, acked in shuffled batches
// from several goroutines, some rejected singly, a few left unsettled. The
// broker must close nothing (an ack of an unknown tag closes the channel)
// and, once the channel is closed, must hold exactly the unsettled ones.
func TestCoalescedAcksSettleExactlyWhatWasAckedOnTheBroker(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const n = 400
	for i := 1; i <= n; i++ {
		e.publish(fmt.Sprintf("m-%03d", i), "{}")
	}
	ch := e.channel()
	if err := ch.Qos(n, 0, false); err != nil {
		t.Fatal(err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	deliveries, err := ch.Consume(e.topo.Queue, "acker-test", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids := make(map[uint64]string, n)
	for range n {
		select {
		case d := <-deliveries:
			ids[d.DeliveryTag] = d.MessageId
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d of %d deliveries arrived", len(ids), n)
		}
	}
	fates, steps := plan(rand.New(rand.NewPCG(1, 2)), n)
	a := newAcker(ch.Ack, time.Millisecond, func(err error, _ int) { t.Errorf("held acks failed: %v", err) })
	var wg sync.WaitGroup
	errs := make(chan error, len(steps))
	rejected := 0
	for _, st := range steps {
		if st.acks == nil {
			rejected++
		}
	}
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < len(steps); i += 4 {
				st := steps[i]
				if st.acks != nil {
					errs <- a.ack(st.acks...)
					continue
				}
				err := ch.Reject(st.other, false) // to the dead-letter queue
				if err == nil {
					a.settled(st.other)
				}
				errs <- err
			}
		})
	}
	wg.Wait()
	a.close()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// A round trip on the channel: the broker has read every ack before it.
	if _, err := ch.QueueDeclarePassive(e.topo.Queue, true, false, false, false, nil); err != nil {
		t.Fatalf("the channel died: an ack the broker refused? %v", err)
	}
	select {
	case err := <-closed:
		t.Fatalf("the broker closed the channel: %v", err)
	default:
	}
	want := map[string]bool{}
	for tag := 1; tag <= n; tag++ {
		if fates[tag] == fateLeft {
			want[ids[uint64(tag)]] = true
		}
	}
	if len(want) == 0 {
		t.Fatal("the plan left nothing unsettled: the test would prove nothing")
	}
	// The round trip above says the channel has read every ack; a quorum
	// queue applies them later (the channel holds settles back while many are
	// in flight to the queue's leader, and drops what it still holds when it
	// closes: those come back as if never acked). So wait until the broker
	// holds exactly the unsettled as unacknowledged before closing: an ack
	// that covered one of them would keep it below len(want) for good.
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("the broker holding the %d unsettled deliveries only", len(want)), func() (bool, error) {
		_, unacked := e.brokerHolds()
		return unacked == len(want), nil
	})
	ch.Close() // the unsettled go back to the queue
	got := map[string]bool{}
	get := e.channel()
	testenv.Eventually(t, 10*time.Second, "the unsettled deliveries back in the queue", func() (bool, error) {
		d, ok, err := get.Get(e.topo.Queue, true)
		if err != nil {
			return false, err
		}
		if ok {
			got[d.MessageId] = true
		}
		return !ok && len(got) >= len(want), nil
	})
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("back in the queue: %v\nwant the unsettled: %v", got, want)
	}
	testenv.Eventually(t, 10*time.Second, fmt.Sprintf("the %d rejected in the dead-letter queue", rejected), func() (bool, error) {
		return e.queueDepth(e.topo.DeadLetterQueue) == rejected, nil
	})
}
