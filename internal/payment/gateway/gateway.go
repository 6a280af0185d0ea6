// Package gateway is the client of the payment gateway's charge API. It makes
// one attempt per call and classifies every failure with a sentinel, so that the
// caller, which owns retries and counts attempts, can decide: ErrUnavailable and
// ErrInFlight are transient and safe to retry with the same idempotency key;
// ErrRejected is permanent.
package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Charge statuses.
const (
	StatusSucceeded = "succeeded"
	StatusDeclined  = "declined"
)

// maxResponseBytes bounds what is read of a response; a charge is far smaller.
const maxResponseBytes = 1 << 20

// Client calls the gateway over HTTP. It is safe for concurrent use.
type Client struct {
	baseURL string
	http    *http.Client
}

// NewClient returns a client of the gateway at baseURL (for example
// http://localhost:8081) whose every call, response body included, is bounded
// by timeout, keeping up to conns idle connections (one per concurrent caller;
// fewer would reopen connections under load).
func NewClient(baseURL string, timeout time.Duration, conns int) *Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = max(conns, 2)
	t.MaxIdleConnsPerHost = max(conns, 2) // net/http's default of 2 would reopen connections under a worker pool
	t.IdleConnTimeout = 30 * time.Second
	return &Client{
		baseURL: strings.TrimRight(baseURL, "/"),
		http: &http.Client{
			Timeout:   timeout,
			Transport: t,
			// A redirected POST would become a GET; report the 3xx instead.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
}

// ChargeRequest asks for one charge. IdempotencyKey must be derived from the
// order, not from the attempt, so that every retry names the same charge.
type ChargeRequest struct {
	IdempotencyKey string
	OrderID        string
	CustomerID     string
	AmountCents    int64
	Currency       string
}

// Charge is the gateway's answer. A decline is an answer, not an error.
type Charge struct {
	ID            string
	OrderID       string
	Status        string // StatusSucceeded or StatusDeclined
	DeclineReason string // set when declined, for example "card_declined"
	Replayed      bool   // the gateway replayed the stored answer to an earlier attempt
}

type chargeBody struct {
	OrderID     string `json:"order_id"`
	CustomerID  string `json:"customer_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

type chargeReply struct {
	ID            string `json:"id"`
	OrderID       string `json:"order_id"`
	Status        string `json:"status"`
	DeclineReason string `json:"decline_reason"`
}

// Charge asks the gateway to charge the order once. Errors match ErrUnavailable,
// ErrInFlight or ErrRejected with errors.Is; failures with an HTTP status are a
// *StatusError.
func (c *Client) Charge(ctx context.Context, req ChargeRequest) (Charge, error) {
	httpReq, err := c.newRequest(ctx, req)
	if err != nil {
		return Charge{}, fmt.Errorf("charge order %s: %w", req.OrderID, err)
	}
	resp, err := c.http.Do(httpReq)
	if err != nil {
		return Charge{}, fmt.Errorf("charge order %s: %w: %w", req.OrderID, ErrUnavailable, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return Charge{}, fmt.Errorf("charge order %s: read response: %w: %w", req.OrderID, ErrUnavailable, err)
	}
	if resp.StatusCode/100 != 2 {
		return Charge{}, fmt.Errorf("charge order %s: %w", req.OrderID, newStatusError(resp.StatusCode, body))
	}
	ch, err := decodeCharge(body)
	if err != nil {
		// The charge may have run: the same key will replay it.
		return Charge{}, fmt.Errorf("charge order %s: %w: %w", req.OrderID, ErrUnavailable, err)
	}
	ch.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	return ch, nil
}

func (c *Client) newRequest(ctx context.Context, req ChargeRequest) (*http.Request, error) {
	body, err := json.Marshal(chargeBody{
		OrderID:     req.OrderID,
		CustomerID:  req.CustomerID,
		AmountCents: req.AmountCents,
		Currency:    req.Currency,
	})
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+"/v1/charges", bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Accept", "application/json")
	r.Header.Set("Idempotency-Key", req.IdempotencyKey)
	// net/http resends a request with an Idempotency-Key header by itself when a
	// reused connection drops before the response. Without GetBody it cannot:
	// the caller owns retries, counts attempts, and must see a lost response.
	r.GetBody = nil
	return r, nil
}

func decodeCharge(body []byte) (Charge, error) {
	var reply chargeReply
	if err := json.Unmarshal(body, &reply); err != nil {
		return Charge{}, fmt.Errorf("decode charge: %w", err)
	}
	if reply.ID == "" || (reply.Status != StatusSucceeded && reply.Status != StatusDeclined) {
		return Charge{}, fmt.Errorf("decode charge: unexpected reply %.200q", body)
	}
	return Charge{ID: reply.ID, OrderID: reply.OrderID, Status: reply.Status, DeclineReason: reply.DeclineReason}, nil
}
