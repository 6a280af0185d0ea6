// Package fakecarrier is the demo's carrier: an HTTP pickup-booking API with
// real idempotency-key semantics, in its own database, and fault knobs, for
// the shipping service of the Compose pipeline, as the fake gateway is for the
// payment service. POST /v1/pickups with an Idempotency-Key books a pickup:
// the key missing is 400; the same key and the same request replays the
// stored answer; the same key and another request is 422; the same key while
// its first request is still in flight is 409 (until the first is presumed
// dead, after InFlightTakeover).
package fakecarrier

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"database/sql"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/inbox-template/payment-service/kit/faults"
	"github.com/inbox-template/payment-service/kit/migrations"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations is the fake carrier's schema, in its own database.
var Migrations = migrations.NewSet("carrier", migrations.Must(migrationFiles, "migrations"))

// Faults are the carrier's knobs.
type Faults struct {
	ErrorRate        float64       `json:"error_rate"`         // 503 before anything is stored
	LostResponseRate float64       `json:"lost_response_rate"` // the booking stored, then the connection dropped
	Latency          time.Duration `json:"-"`                  // network time of every booking
}

// Validate reports a knob out of range.
func (f Faults) Validate() error {
	switch {
	case !(f.ErrorRate >= 0 && f.ErrorRate <= 1):
		return fmt.Errorf("error rate must be between 0 and 1, got %v", f.ErrorRate)
	case !(f.LostResponseRate >= 0 && f.LostResponseRate <= 1):
		return fmt.Errorf("lost response rate must be between 0 and 1, got %v", f.LostResponseRate)
	case f.Latency < 0 || f.Latency > time.Minute:
		return fmt.Errorf("latency must be between 0 and 1m, got %s", f.Latency)
	}
	return nil
}

// Server is the fake carrier.
type Server struct {
	db       *sql.DB
	log      *slog.Logger
	takeover time.Duration
	mu       sync.Mutex
	faults   Faults
	// fault endpoints (WithFaultEndpoints): served, and the token they want
	faultsOn    bool
	faultsToken string
}

// WithFaultEndpoints serves GET and POST /faults (the knobs at run time),
// to callers with "Authorization: Bearer <token>" ("": any caller, for a
// loopback-only listener).
func (s *Server) WithFaultEndpoints(token string) *Server {
	s.faultsOn, s.faultsToken = true, token
	return s
}

// NewServer returns a carrier storing its bookings in db; a key in flight
// longer than takeover is taken over by the next request for it.
func NewServer(db *sql.DB, faults Faults, takeover time.Duration, log *slog.Logger) (*Server, error) {
	if err := faults.Validate(); err != nil {
		return nil, err
	}
	return &Server{db: db, log: log, takeover: takeover, faults: faults}, nil
}

// Handler serves /v1/pickups, /healthz and, with WithFaultEndpoints, /faults
// (GET and POST).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/pickups", s.book)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.db.PingContext(r.Context()); err != nil {
			http.Error(w, "database: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	if s.faultsOn {
		mux.Handle("GET /faults", faults.Guard(s.faultsToken, http.HandlerFunc(s.getFaults)))
		mux.Handle("POST /faults", faults.Guard(s.faultsToken, http.HandlerFunc(s.setFaults)))
	}
	return mux
}

// pickupRequest is the body of a booking.
type pickupRequest struct {
	OrderID string `json:"order_id"`
	Address string `json:"address"`
}

func (s *Server) current() Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults
}

func (s *Server) book(w http.ResponseWriter, r *http.Request) {
	f := s.current()
	key := r.Header.Get("Idempotency-Key")
	raw, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	var req pickupRequest
	switch {
	case key == "" || len(key) > 255 || strings.ContainsFunc(key, unicode.IsControl):
		answer(w, http.StatusBadRequest, `{"error":"an Idempotency-Key header of at most 255 printable bytes is required"}`)
		return
	case err != nil:
		answer(w, http.StatusBadRequest, `{"error":"unreadable body"}`)
		return
	case json.Unmarshal(raw, &req) != nil || req.OrderID == "" || req.Address == "":
		answer(w, http.StatusBadRequest, `{"error":"want a JSON object with order_id and address"}`)
		return
	case rand.Float64() < f.ErrorRate:
		answer(w, http.StatusServiceUnavailable, `{"error":"injected fault"}`)
		return
	}
	// The work is detached from the client: a client that gives up does not
	// roll back a booking the carrier made.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 30*time.Second)
	defer cancel()
	fp := sha256.Sum256(append([]byte(req.OrderID+"\x00"), req.Address...))
	code, body, err := s.claimOrReplay(ctx, key, fp[:], req, f.Latency)
	if err != nil {
		s.log.Error("booking failed", "key", key, "err", err)
		answer(w, http.StatusInternalServerError, `{"error":"internal error"}`)
		return
	}
	if code == http.StatusOK && rand.Float64() < f.LostResponseRate {
		s.log.Info("booking stored, response dropped (fault)", "key", key, "order_id", req.OrderID)
		dropConnection(w)
		return
	}
	answer(w, code, string(body))
}

// claimOrReplay books the pickup if the key is new (or its holder is
// presumed dead), else answers from what the key holds.
func (s *Server) claimOrReplay(ctx context.Context, key string, fp []byte, req pickupRequest, latency time.Duration) (int, []byte, error) {
	pickupID := newPickupID()
	res, err := s.db.ExecContext(ctx, `INSERT INTO pickups (idempotency_key, fingerprint, order_id, address, pickup_id, state)
		VALUES ($1, $2, $3, $4, $5, 'in_flight') ON CONFLICT DO NOTHING`, key, fp, req.OrderID, req.Address, pickupID)
	if err != nil {
		return 0, nil, err
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return s.execute(ctx, key, pickupID, req, latency)
	}
	var stored []byte
	var state string
	var response []byte
	var claimed time.Time
	err = s.db.QueryRowContext(ctx, `SELECT fingerprint, state, response, claimed_at FROM pickups WHERE idempotency_key = $1`, key).
		Scan(&stored, &state, &response, &claimed)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return http.StatusConflict, []byte(`{"error":"the key is being released; try again"}`), nil
	case err != nil:
		return 0, nil, err
	case !bytes.Equal(stored, fp):
		return http.StatusUnprocessableEntity, []byte(`{"error":"the idempotency key was used for another request"}`), nil
	case state == "completed":
		_, err := s.db.ExecContext(ctx, `UPDATE pickups SET replays = replays + 1 WHERE idempotency_key = $1`, key)
		return http.StatusOK, response, err
	case time.Since(claimed) < s.takeover:
		return http.StatusConflict, []byte(`{"error":"a request with this idempotency key is in flight"}`), nil
	}
	// Its first request is presumed dead: one taker wins and books.
	res, err = s.db.ExecContext(ctx, `UPDATE pickups SET claimed_at = now() WHERE idempotency_key = $1 AND state = 'in_flight' AND claimed_at = $2`, key, claimed)
	if err != nil {
		return 0, nil, err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return http.StatusConflict, []byte(`{"error":"a request with this idempotency key is in flight"}`), nil
	}
	var existing string
	if err := s.db.QueryRowContext(ctx, `SELECT pickup_id FROM pickups WHERE idempotency_key = $1`, key).Scan(&existing); err != nil {
		return 0, nil, err
	}
	return s.execute(ctx, key, existing, req, latency)
}

// execute books the pickup (it spends the network latency in flight) and
// stores the answer for the key's replays.
func (s *Server) execute(ctx context.Context, key, pickupID string, req pickupRequest, latency time.Duration) (int, []byte, error) {
	if latency > 0 {
		t := time.NewTimer(latency)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return 0, nil, ctx.Err()
		}
	}
	body, _ := json.Marshal(map[string]string{"pickup_id": pickupID, "order_id": req.OrderID})
	if _, err := s.db.ExecContext(ctx, `UPDATE pickups SET state = 'completed', response = $2, completed_at = now() WHERE idempotency_key = $1`,
		key, body); err != nil {
		return 0, nil, err
	}
	s.log.Info("pickup booked", "key", key, "order_id", req.OrderID, "pickup_id", pickupID)
	return http.StatusOK, body, nil
}

func (s *Server) getFaults(w http.ResponseWriter, _ *http.Request) {
	f := s.current()
	body, _ := json.Marshal(faultsJSON{ErrorRate: f.ErrorRate, LostResponseRate: f.LostResponseRate, Latency: f.Latency.String()})
	answer(w, http.StatusOK, string(body))
}

// faultsJSON is the body of /faults: rates, and the latency as a duration.
type faultsJSON struct {
	ErrorRate        float64 `json:"error_rate"`
	LostResponseRate float64 `json:"lost_response_rate"`
	Latency          string  `json:"latency"`
}

func (s *Server) setFaults(w http.ResponseWriter, r *http.Request) {
	var in faultsJSON
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<12))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		answer(w, http.StatusBadRequest, fmt.Sprintf(`{"error":%q}`, err.Error()))
		return
	}
	f := Faults{ErrorRate: in.ErrorRate, LostResponseRate: in.LostResponseRate}
	if in.Latency != "" {
		d, err := time.ParseDuration(in.Latency)
		if err != nil {
			answer(w, http.StatusBadRequest, fmt.Sprintf(`{"error":%q}`, err.Error()))
			return
		}
		f.Latency = d
	}
	if err := f.Validate(); err != nil {
		answer(w, http.StatusBadRequest, fmt.Sprintf(`{"error":%q}`, err.Error()))
		return
	}
	s.mu.Lock()
	s.faults = f
	s.mu.Unlock()
	s.log.Warn("faults set", "error_rate", f.ErrorRate, "lost_response_rate", f.LostResponseRate, "latency", f.Latency.String())
	s.getFaults(w, r)
}

func answer(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	// #nosec G705 -- a JSON API (the header above), not HTML: nothing to escape
	_, _ = io.WriteString(w, body+"\n")
}

// dropConnection closes the connection without a response, as a network
// failure after the booking would.
func dropConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}

func newPickupID() string {
	var b [8]byte
	_, _ = crand.Read(b[:])
	return "pu_" + hex.EncodeToString(b[:])
}
