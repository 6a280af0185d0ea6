package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Sentinels that classify every error of Client.Charge.
var (
	// ErrUnavailable: no definitive answer (5xx, timeout, refused or reset
	// connection, response lost). Transient: retry with the same key.
	ErrUnavailable = errors.New("gateway unavailable")
	// ErrInFlight: an earlier attempt with the key is still running (409).
	// Transient: retry with the same key later.
	ErrInFlight = errors.New("gateway request with this idempotency key in flight")
	// ErrRejected: the gateway refused this request (400, 402). Permanent:
	// the same request will be refused again.
	ErrRejected = errors.New("gateway rejected the request")
	// ErrKeyReused: the idempotency key was used before with a different
	// request (422): for us, the same order with another amount, currency
	// or customer. Permanent, and a conflict to look at.
	ErrKeyReused = errors.New("gateway idempotency key reused with a different request")
	// ErrMisconfigured: the gateway refuses every request alike (401 or 403:
	// credentials; 404 or 405: a wrong URL; other 4xx): a fault of our
	// configuration, not of the message. Pause, do not dead-letter.
	ErrMisconfigured = errors.New("gateway refuses every request: check GATEWAY_URL and credentials")
)

// maxErrorBody bounds StatusError.Body, which ends up in logs and headers.
const maxErrorBody = 1024

// StatusError is an answer with a status other than 2xx.
type StatusError struct {
	Code int
	Body string // the response body, truncated to 1 KiB
}

func newStatusError(code int, body []byte) *StatusError {
	if len(body) > maxErrorBody {
		body = body[:maxErrorBody]
	}
	// Drops a character that the cut split, so that the text logs cleanly.
	return &StatusError{Code: code, Body: strings.ToValidUTF8(string(body), "")}
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("gateway answered %d %s: %s", e.Code, http.StatusText(e.Code), e.Body)
}

// Unwrap returns the sentinel of the status. Only the request's own faults
// are permanent: 400 and 402 (ErrRejected) and 422 (ErrKeyReused). 408, 425
// and 429 are transient although they are 4xx: the request was not processed
// and may be sent again. Every other 4xx says nothing about this request and
// the same about the next one (ErrMisconfigured), and so does a redirect (3xx,
// not followed: an http URL for an https gateway). 5xx is not a definitive
// answer; retrying with the key is safe.
func (e *StatusError) Unwrap() error {
	switch {
	case e.Code == http.StatusConflict:
		return ErrInFlight
	case e.Code == http.StatusUnprocessableEntity:
		return ErrKeyReused
	case e.Code == http.StatusBadRequest, e.Code == http.StatusPaymentRequired:
		return ErrRejected
	case e.Code == http.StatusRequestTimeout, e.Code == http.StatusTooEarly, e.Code == http.StatusTooManyRequests:
		return ErrUnavailable
	case e.Code >= 300 && e.Code < 500:
		// A redirect too: an http URL for an https gateway, a moved path.
		return ErrMisconfigured
	default:
		return ErrUnavailable
	}
}
