package fakegateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/faults"
)

// Options are the Server's settings besides its dependencies.
type Options struct {
	// InFlightTakeover is the age after which an in-flight key is presumed
	// abandoned by a crashed gateway and may be executed by a later request.
	InFlightTakeover time.Duration
	// FaultsEnabled serves GET, POST and DELETE /faults; without it they answer 404.
	FaultsEnabled bool
	// FaultsToken, if set, is the bearer token /faults requires (401 without).
	FaultsToken string
}

// Server is the fake gateway's HTTP API.
type Server struct {
	store    Store
	log      *slog.Logger
	metrics  *metrics
	gatherer prometheus.Gatherer
	opts     Options

	mu     sync.Mutex // guards faults, which POST /faults changes at run time
	faults Faults
}

// NewServer builds a Server over a database migrated with Migrations and
// registers its metrics with reg, which /metrics then serves.
func NewServer(db *gorm.DB, reg *prometheus.Registry, log *slog.Logger, faults Faults, opts Options) (*Server, error) {
	return NewServerWithStore(NewPostgresStore(db), reg, log, faults, opts)
}

// NewServerWithStore builds a Server over st, a PostgresStore or a MemoryStore,
// and registers its metrics with reg, which /metrics then serves.
func NewServerWithStore(st Store, reg *prometheus.Registry, log *slog.Logger, faults Faults, opts Options) (*Server, error) {
	if err := faults.Validate(); err != nil {
		return nil, fmt.Errorf("faults: %w", err)
	}
	if opts.InFlightTakeover <= 0 {
		return nil, fmt.Errorf("in-flight takeover must be positive, got %s", opts.InFlightTakeover)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("register gateway metrics: %w", err)
	}
	return &Server{
		store:    st,
		log:      log,
		metrics:  m,
		gatherer: reg,
		opts:     opts,
		faults:   faults,
	}, nil
}

// Handler routes the API. Unknown paths answer 404 and known paths with the
// wrong method 405, as net/http's pattern mux does.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", s.handleCharge)
	mux.HandleFunc("GET /healthz", s.handleHealth)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.gatherer, promhttp.HandlerOpts{}))
	if s.opts.FaultsEnabled {
		mux.Handle("GET /faults", faults.Guard(s.opts.FaultsToken, http.HandlerFunc(s.handleGetFaults)))
		mux.Handle("POST /faults", faults.Guard(s.opts.FaultsToken, http.HandlerFunc(s.handleSetFaults)))
		mux.Handle("DELETE /faults", faults.Guard(s.opts.FaultsToken, http.HandlerFunc(s.handleClearFaults)))
	}
	return mux
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.store.ping(ctx); err != nil {
		s.log.WarnContext(ctx, "health check failed", slog.Any("error", err))
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// writeJSON answers with v encoded; it is for bodies that are never replayed.
func writeJSON(w http.ResponseWriter, code int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		code, body = http.StatusInternalServerError, []byte(`{"error":"internal error"}`)
	}
	writeBody(w, code, body)
}

func writeBody(w http.ResponseWriter, code int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(body) // the client left; nothing to do about it
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}

// errorText is the message of err for a 400 body; MaxBytesReader's error is
// reworded because its text names no limit.
func errorText(err error) string {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return fmt.Sprintf("body larger than %d bytes", tooLarge.Limit)
	}
	return err.Error()
}
