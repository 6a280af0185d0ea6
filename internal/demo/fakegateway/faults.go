package fakegateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"time"
)

// maxLatency bounds the Latency knob, like FAULT_LATENCY in config.FakeGateway.
const maxLatency = time.Minute

// Faults are the gateway's fault knobs.
type Faults struct {
	// ErrorRate is the probability of answering 503 before anything is stored.
	ErrorRate float64
	// LostResponseRate is the probability of executing and storing a charge and
	// then dropping the connection without a response.
	LostResponseRate float64
	// Latency is the network time of every charge request; a request that
	// executes a charge spends it in flight (see the package documentation).
	Latency time.Duration
	// KeyTTL is how long a completed idempotency key is remembered; 0 is
	// forever. A request with a key older than that is a new charge, as at a
	// real gateway (Stripe forgets keys after 24 hours).
	KeyTTL time.Duration
}

// Validate reports a knob out of range.
func (f Faults) Validate() error {
	switch {
	case !(f.ErrorRate >= 0 && f.ErrorRate <= 1): // also rejects NaN
		return fmt.Errorf("error rate must be between 0 and 1, got %v", f.ErrorRate)
	case !(f.LostResponseRate >= 0 && f.LostResponseRate <= 1):
		return fmt.Errorf("lost response rate must be between 0 and 1, got %v", f.LostResponseRate)
	case f.Latency < 0 || f.Latency > maxLatency:
		return fmt.Errorf("latency must be between 0 and %s, got %s", maxLatency, f.Latency)
	case f.KeyTTL < 0:
		return fmt.Errorf("key lifetime must be 0 (forever) or positive, got %s", f.KeyTTL)
	}
	return nil
}

// Faults returns the current knobs.
func (s *Server) Faults() Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults
}

// SetFaults replaces the knobs; requests already running keep the old ones.
func (s *Server) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = f
	return nil
}

// roll reports true with probability p; 0 never and 1 always, so tests can rely on them.
func roll(p float64) bool { return rand.Float64() < p }

// faultsJSON is the wire form of Faults; pointers tell an omitted field from a zero.
type faultsJSON struct {
	ErrorRate        *float64 `json:"error_rate,omitempty"`
	LostResponseRate *float64 `json:"lost_response_rate,omitempty"`
	Latency          *string  `json:"latency,omitempty"`
	KeyTTL           *string  `json:"key_ttl,omitempty"`
}

func (s *Server) handleGetFaults(w http.ResponseWriter, _ *http.Request) {
	f := s.Faults()
	latency, keyTTL := f.Latency.String(), f.KeyTTL.String()
	writeJSON(w, http.StatusOK, faultsJSON{ErrorRate: &f.ErrorRate, LostResponseRate: &f.LostResponseRate, Latency: &latency, KeyTTL: &keyTTL})
}

// handleSetFaults changes the knobs present in the body and keeps the others.
func (s *Server) handleSetFaults(w http.ResponseWriter, r *http.Request) {
	var in faultsJSON
	if err := decodeStrict(w, r, &in); err != nil {
		writeError(w, http.StatusBadRequest, errorText(err))
		return
	}
	// Read, change and write under one lock so that concurrent partial updates
	// do not undo each other.
	s.mu.Lock()
	defer s.mu.Unlock()
	f, err := in.apply(s.faults)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.faults = f
	w.WriteHeader(http.StatusNoContent)
}

// handleClearFaults turns the faults off: no 503s, no lost responses, no
// latency. The key lifetime is the gateway's semantics, not a fault: it stays.
func (s *Server) handleClearFaults(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = Faults{KeyTTL: s.faults.KeyTTL}
	w.WriteHeader(http.StatusNoContent)
}

func (in faultsJSON) apply(f Faults) (Faults, error) {
	if in.ErrorRate != nil {
		f.ErrorRate = *in.ErrorRate
	}
	if in.LostResponseRate != nil {
		f.LostResponseRate = *in.LostResponseRate
	}
	if in.Latency != nil {
		d, err := time.ParseDuration(*in.Latency)
		if err != nil {
			return f, fmt.Errorf("latency must be a Go duration like 200ms: %w", err)
		}
		f.Latency = d
	}
	if in.KeyTTL != nil {
		d, err := time.ParseDuration(*in.KeyTTL)
		if err != nil {
			return f, fmt.Errorf("key_ttl must be a Go duration like 24h: %w", err)
		}
		f.KeyTTL = d
	}
	return f, f.Validate()
}

// decodeStrict decodes one JSON object with no unknown fields and no trailing data.
func decodeStrict(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		return fmt.Errorf("read body: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("invalid JSON body: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("invalid JSON body: trailing data after the object")
	}
	return nil
}
