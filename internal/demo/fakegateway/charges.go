package fakegateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"time"
)

// storeTimeout bounds a request's database work before and after the latency fault.
const storeTimeout = 10 * time.Second

// detached returns a context for the store that the client's disconnect does not
// cancel: a claim or a completion cut short half way would leave a row that
// nobody owns until the takeover age.
func detached(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(r.Context()), storeTimeout)
}

// call is one POST /v1/charges on its way through the handler.
type call struct {
	w      http.ResponseWriter
	r      *http.Request
	key    string
	req    chargeRequest
	faults Faults    // read once, so one request sees one setting
	start  time.Time // when the request arrived
}

// networkTimeLeft is what remains of the latency fault for this request. Every
// charge request takes at least the latency: one that executes a charge spends
// it in flight, every other one before its answer.
func (c call) networkTimeLeft() time.Duration {
	return time.Until(c.start.Add(c.faults.Latency))
}

// answer writes the response once the latency fault's time has passed; a client
// that leaves before gets nothing, as it would read nothing.
func (c call) answer(code int, body []byte) {
	if sleep(c.r.Context(), c.networkTimeLeft()) != nil {
		return
	}
	writeBody(c.w, code, body)
}

func (c call) answerError(code int, msg string) {
	body, err := json.Marshal(map[string]string{"error": msg})
	if err != nil {
		code, body = http.StatusInternalServerError, []byte(`{"error":"internal error"}`)
	}
	c.answer(code, body)
}

func (s *Server) handleCharge(w http.ResponseWriter, r *http.Request) {
	c := call{w: w, r: r, faults: s.Faults(), start: time.Now()}
	if roll(c.faults.ErrorRate) {
		s.record(r, resultInjectedError, rawKey(r), "", http.StatusServiceUnavailable)
		c.answerError(http.StatusServiceUnavailable, "injected error: the gateway is unavailable")
		return
	}
	key, err := idempotencyKey(r)
	if err != nil {
		s.badRequest(c, rawKey(r), "", err)
		return
	}
	req, err := decodeCharge(w, r)
	if err != nil {
		s.badRequest(c, key, req.OrderID, err)
		return
	}
	c.key, c.req = key, req
	ctx, cancel := detached(r)
	defer cancel()
	fp := req.fingerprint()
	cl, claimed, err := s.store.claim(ctx, newChargeID(), key, fp, req)
	switch {
	case err != nil:
		s.internalError(c, err)
	case claimed:
		s.execute(c, cl, false)
	default:
		s.handleTaken(ctx, c, fp)
	}
}

// handleTaken answers a request whose key another request inserted first.
func (s *Server) handleTaken(ctx context.Context, c call, fp []byte) {
	e, err := s.store.lookup(ctx, c.key, s.opts.InFlightTakeover, c.faults.KeyTTL)
	switch {
	case errors.Is(err, errKeyReleased): // by an abandoned request since our claim: retry soon
		s.inFlight(c)
	case err != nil:
		s.internalError(c, err)
	case e.expired: // forgotten: whatever the request, it is a new one
		s.chargeAgain(ctx, c, e, fp)
	case !bytes.Equal(e.fingerprint, fp):
		s.record(c.r, resultMismatch, c.key, c.req.OrderID, http.StatusUnprocessableEntity, slog.String("charge_id", e.id))
		c.answerError(http.StatusUnprocessableEntity, "idempotency key reused with a different request")
	case e.state == stateCompleted:
		s.replay(ctx, c, e.id)
	case e.stale:
		s.takeOver(ctx, c, e)
	default:
		s.inFlight(c)
	}
}

func (s *Server) replay(ctx context.Context, c call, chargeID string) {
	code, body, err := s.store.replay(ctx, c.key)
	if err != nil {
		s.internalError(c, err)
		return
	}
	s.record(c.r, resultReplayed, c.key, c.req.OrderID, code, slog.String("charge_id", chargeID))
	c.w.Header().Set("Idempotent-Replayed", "true")
	c.answer(code, body)
}

// chargeAgain forgets an expired key and claims it for this request: the
// card is charged again, as at a real gateway that forgot the key.
func (s *Server) chargeAgain(ctx context.Context, c call, e existing, fp []byte) {
	forgot, err := s.store.forget(ctx, e)
	if err != nil {
		s.internalError(c, err)
		return
	}
	if forgot {
		s.metrics.forgotten.Inc()
		s.log.WarnContext(ctx, "idempotency key expired and forgotten: the next request with it charges again",
			slog.String("idempotency_key", c.key), slog.String("order_id", c.req.OrderID),
			slog.String("charge_id", e.id), slog.String("key_ttl", c.faults.KeyTTL.String()))
	}
	cl, claimed, err := s.store.claim(ctx, newChargeID(), c.key, fp, c.req)
	switch {
	case err != nil:
		s.internalError(c, err)
	case !claimed:
		s.inFlight(c) // a concurrent request claimed the key first and charges now
	default:
		s.execute(c, cl, false)
	}
}

func (s *Server) takeOver(ctx context.Context, c call, e existing) {
	cl, won, err := s.store.takeOver(ctx, e)
	switch {
	case err != nil:
		s.internalError(c, err)
	case !won:
		s.inFlight(c) // another request took it over first and runs it now
	default:
		s.metrics.takeovers.Inc()
		s.execute(c, cl, true)
	}
}

func (s *Server) inFlight(c call) {
	s.record(c.r, resultInFlight, c.key, c.req.OrderID, http.StatusConflict)
	c.answerError(http.StatusConflict, "a request with this idempotency key is in flight")
}

// execute runs the charge this request has claimed and stores its response.
// The latency fault's time passes in flight, after the claim, which widens the
// window for concurrent retries (409). It waits on the client's context: a
// client that leaves before the charge runs releases the claim.
func (s *Server) execute(c call, cl claim, tookOver bool) {
	sleepErr := sleep(c.r.Context(), c.networkTimeLeft())
	ctx, cancel := detached(c.r) // after the sleep, which may outlast storeTimeout
	defer cancel()
	if sleepErr != nil {
		s.abandon(ctx, c, cl)
		return
	}
	resp := c.req.execute(cl.id)
	body, err := json.Marshal(resp)
	if err != nil {
		s.internalError(c, err)
		return
	}
	code := http.StatusCreated
	completed, err := s.store.complete(ctx, resp, code, body)
	if err != nil {
		s.internalError(c, err) // the row stays in flight; a retry takes it over later
		return
	}
	if completed {
		s.metrics.charges.WithLabelValues(resp.Status).Inc()
	} else if code, body, err = s.store.stored(ctx, cl.id); err != nil {
		s.internalError(c, err)
		return
	}
	attrs := []slog.Attr{slog.String("charge_id", cl.id), slog.String("status", resp.Status), slog.Bool("took_over", tookOver)}
	if roll(c.faults.LostResponseRate) {
		s.record(c.r, resultLostResponse, c.key, c.req.OrderID, 0, attrs...)
		dropConnection(c.w)
		return
	}
	s.record(c.r, resultCreated, c.key, c.req.OrderID, code, attrs...)
	c.answer(code, body)
}

// abandon releases the claim of a request whose client left during the latency
// fault: nothing was charged, so a retry may execute the key at once.
func (s *Server) abandon(ctx context.Context, c call, cl claim) {
	if err := s.store.release(ctx, cl); err != nil {
		s.internalError(c, err)
		return
	}
	s.record(c.r, resultAbandoned, c.key, c.req.OrderID, 0, slog.String("charge_id", cl.id))
}

// dropConnection closes the connection without a response, as a network failure
// after the charge would. Without a hijackable connection (HTTP/2) the handler
// aborts, which resets the stream instead.
func dropConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close() // the client sees EOF either way
}

// sleep waits for d or until ctx ends, whichever is first.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Server) badRequest(c call, key, orderID string, err error) {
	s.record(c.r, resultBadRequest, key, orderID, http.StatusBadRequest, slog.String("reason", errorText(err)))
	c.answerError(http.StatusBadRequest, errorText(err))
}

func (s *Server) internalError(c call, err error) {
	s.record(c.r, resultInternalError, c.key, c.req.OrderID, http.StatusInternalServerError, slog.Any("error", err))
	c.answerError(http.StatusInternalServerError, "internal error")
}

// rawKey is the unvalidated key for a log line, cut to a sane length.
func rawKey(r *http.Request) string {
	key := r.Header.Get("Idempotency-Key")
	if len(key) > maxKeyLen {
		return key[:maxKeyLen] + "…"
	}
	return key
}

// record counts a request's result and logs its one line. Code 0 means that no
// response was written. At thousands of charges a second the Info line is the
// gateway's largest cost; LOG_LEVEL=warn skips it before anything is formatted.
func (s *Server) record(r *http.Request, result, key, orderID string, code int, attrs ...slog.Attr) {
	s.metrics.requests.WithLabelValues(result).Inc()
	level := slog.LevelInfo
	switch result {
	case resultInternalError:
		level = slog.LevelError
	case resultInjectedError, resultLostResponse, resultAbandoned:
		level = slog.LevelWarn
	}
	if !s.log.Enabled(r.Context(), level) {
		return
	}
	base := []slog.Attr{
		slog.String("result", result),
		slog.String("idempotency_key", key),
		slog.String("order_id", orderID),
		slog.Int("code", code),
	}
	s.log.LogAttrs(r.Context(), level, "charge request", append(base, attrs...)...)
}
