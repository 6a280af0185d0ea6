package shipping

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/inbox-template/payment-service/kit"
)

// Pickup asks the carrier to collect one order's parcel. Key is the
// idempotency key: the same key books the same pickup.
type Pickup struct {
	Key     string `json:"-"`
	OrderID string `json:"order_id"`
	Address string `json:"address"`
}

// Carrier is the client of a carrier's pickup API.
type Carrier struct {
	url  string
	http *http.Client
}

// NewCarrier returns a client of the carrier at url keeping up to conns idle
// connections, one per worker.
func NewCarrier(url string, timeout time.Duration, conns int) *Carrier {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost = conns, conns
	return &Carrier{url: strings.TrimRight(url, "/"), http: &http.Client{Timeout: timeout, Transport: t}}
}

// Book books the pickup and returns its id. A 4xx but 408, 409 and 429 is
// the request's own fault and permanent; anything else is retried. 409 says
// that an earlier request with the key is still in flight (one whose answer
// this client gave up waiting for, say): the pickup may be booked yet, and
// a retry gets its answer once the first is done. (A carrier whose 409
// means a conflict of the business would need its own case here.)
func (c *Carrier) Book(ctx context.Context, p Pickup) (string, error) {
	body, _ := json.Marshal(p)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/v1/pickups", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", p.Key)
	req.GetBody = nil // the runtime owns retries: never resend by itself
	resp, err := c.http.Do(req)
	if err != nil {
		return "", fmt.Errorf("book pickup of order %s: %w", p.OrderID, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode/100 != 2 {
		err := fmt.Errorf("book pickup of order %s: carrier answered %d: %.200s", p.OrderID, resp.StatusCode, raw)
		if resp.StatusCode/100 == 4 && resp.StatusCode != http.StatusRequestTimeout &&
			resp.StatusCode != http.StatusConflict && resp.StatusCode != http.StatusTooManyRequests {
			return "", kit.Permanent(ReasonCarrierRejected, err)
		}
		return "", err
	}
	var out struct {
		PickupID string `json:"pickup_id"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || out.PickupID == "" {
		return "", fmt.Errorf("book pickup of order %s: unreadable answer %.200q", p.OrderID, raw)
	}
	return out.PickupID, nil
}
