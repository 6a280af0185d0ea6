package consumer

import (
	"fmt"
	"sync"
	"time"
)

// acker coalesces the acks of one consuming channel. RabbitMQ numbers a
// channel's deliveries 1, 2, 3, … with no gap, so every tag below the lowest
// one not yet settled (next) is settled. When acks reach from next upwards,
// one ack with multiple=true settles them all: one frame, and one settle
// command in the quorum queue's log, instead of one each.
//
// Acks that do not reach next (a lower delivery is still in a handler, or in
// another committer's batch) are held for at most hold, in case it comes;
// then each is sent on its own. So an ack is sent within hold of its commit;
// a crash in between redelivers the message, which the inbox then counts as
// a duplicate. The session flushes what is held before it closes the channel.
//
// A multiple ack must not reach past a delivery that is not settled: that
// would ack a message whose effect is not committed. So every other way a
// delivery of the channel is settled (a nack, a reject) is reported with
// settled, after it is sent; a delivery left unacked is never reported, and
// the multiple acks stop below it.
type acker struct {
	mu     sync.Mutex
	send   func(tag uint64, multiple bool) error // the channel's Ack
	failed func(err error, held int)             // a held ack could not be sent
	hold   time.Duration
	next   uint64          // lowest tag not known settled
	above  map[uint64]bool // tags above next: true held for an ack, false settled
	held   int
	timer  *time.Timer
	off    bool // closed, or too many tags kept above a stuck next: single acks only
}

// ackerLimit bounds the tags kept above a delivery left unsettled: past it
// the channel's acks are single acks until the session ends.
const ackerLimit = 1 << 14

// ackHold is how long an ack waits for the lower ones to join it.
const ackHold = 5 * time.Millisecond

func newAcker(send func(tag uint64, multiple bool) error, hold time.Duration, failed func(err error, held int)) *acker {
	return &acker{send: send, failed: failed, hold: hold, next: 1, above: make(map[uint64]bool)}
}

// ack hands the given deliveries of the channel over to be acked, each
// exactly once. Those that now reach from the lowest unsettled tag are acked
// at once with one multiple ack, whose error it returns; the rest are held
// (see acker).
func (a *acker) ack(tags ...uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.off {
		return a.single(tags)
	}
	var err error
	for _, t := range tags {
		if _, settled := a.above[t]; t < a.next || settled {
			// Cannot happen (a delivery is settled once). Another ack of it
			// would close the channel (PRECONDITION_FAILED).
			if err == nil {
				err = fmt.Errorf("delivery %d is settled already: not acked again", t)
			}
			continue
		}
		a.above[t] = true
		a.held++
	}
	if n, e := a.advance(); e != nil {
		a.failed(e, n) // the held acks of other batches it covered
		if err == nil {
			err = e
		}
	}
	a.schedule()
	return err
}

// settled records a delivery settled some other way, after it was sent.
func (a *acker) settled(tag uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.off || tag < a.next {
		return
	}
	a.above[tag] = false
	if n, err := a.advance(); err != nil {
		a.failed(err, n)
	}
	a.schedule()
}

// advance walks next up over the tags settled or held, and acks the n held
// ones it passed with one multiple ack.
func (a *acker) advance() (n int, err error) {
	var last uint64
	for {
		h, ok := a.above[a.next]
		if !ok {
			break
		}
		if h {
			last = a.next
			a.held--
			n++
		}
		delete(a.above, a.next)
		a.next++
	}
	if last == 0 {
		return 0, nil
	}
	return n, a.send(last, true)
}

// schedule starts the hold's timer when acks are held, and falls back to
// single acks if too many tags are kept.
func (a *acker) schedule() {
	if len(a.above) > ackerLimit {
		a.flushLocked()
		a.off, a.above = true, nil
		return
	}
	if a.held > 0 && a.timer == nil {
		a.timer = time.AfterFunc(a.hold, a.flush)
	}
}

// flush sends every held ack on its own.
func (a *acker) flush() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.flushLocked()
}

func (a *acker) flushLocked() {
	if a.timer != nil {
		a.timer.Stop()
		a.timer = nil
	}
	if a.held == 0 {
		return
	}
	var err error
	n := 0
	for t, h := range a.above {
		if !h {
			continue
		}
		a.above[t] = false
		if e := a.send(t, false); e != nil {
			n++
			if err == nil {
				err = e
			}
		}
	}
	a.held = 0
	if err != nil {
		a.failed(err, n)
	}
}

// close sends what is held; later acks are sent one by one at once.
func (a *acker) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.flushLocked()
	a.off, a.above = true, nil
}

func (a *acker) single(tags []uint64) error {
	var err error
	for _, t := range tags {
		if e := a.send(t, false); err == nil {
			err = e
		}
	}
	return err
}
