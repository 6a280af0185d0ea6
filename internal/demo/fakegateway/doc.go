// Package fakegateway is an HTTP payment gateway with real idempotency-key
// semantics (Stripe's, and the IETF Idempotency-Key draft's) and fault knobs, so
// that the payment service can be tested against lost responses, errors and
// concurrent retries without a real card network.
//
// # API
//
// POST /v1/charges takes an Idempotency-Key header (1 to 255 characters) and a
// JSON body {"order_id","customer_id","amount_cents","currency"}, and answers 201
// with the charge. Each key is one charge in the Store:
//
//   - A new key is stored in the state in_flight, visible to other requests,
//     before the charge is executed; it then becomes completed with the exact
//     response.
//   - The same key with the same request replays the stored response byte for
//     byte, with the header Idempotent-Replayed: true.
//   - The same key with a different request (compared by a SHA-256 fingerprint of
//     order_id, customer_id, amount_cents and currency) answers 422.
//   - The same key while the first request is still in flight answers 409, unless
//     the in-flight row is older than the takeover age: the gateway is presumed to
//     have crashed mid-request, and exactly one later request takes it over and
//     executes it.
//   - With a key lifetime (Faults.KeyTTL, 0 by default: forever), a key whose
//     charge completed longer ago than that is forgotten, as a real gateway
//     forgets keys (Stripe after 24 hours): the next request with it, whatever
//     its body, is a new charge. The old charge stays stored, so a card charged
//     twice that way shows as two charges of one order.
//
// GET /healthz answers 200 while the store answers. GET /metrics serves the
// Prometheus registry. GET, POST and DELETE /faults read, set and clear the fault knobs (and
// the key lifetime), and exist only when the Server is built with
// FaultsEnabled.
//
// # Decline rule
//
// Outcomes are deterministic so that tests and demos can ask for a decline: an
// amount whose last two digits are 02 (amount_cents % 100 == 2, for example 1002)
// is declined with the reason card_declined, like the card number ending 0002 in
// Stripe's test mode. Every other amount succeeds.
//
// # Faults
//
// ErrorRate answers 503 before anything is stored. LostResponseRate executes and
// stores the charge, then drops the connection without a response, as a network
// failure after the charge would. Latency is the network time of every charge
// request, whatever its answer: a request that executes a charge spends it in
// flight, after its claim is stored, which widens the window for concurrent
// retries (409); any other request (a replay, 409, 422, 400, an injected 503)
// answers once that time has passed since it arrived. A client that leaves
// while its charge waits releases the claim.
//
// # Stores
//
// PostgresStore keeps the charges in the table charges of the gateway's own
// database, one commit per claim and one per completion; the fault scripts and
// inboxctl verify need it. MemoryStore has the same semantics without a
// database, so that a benchmark measures the consumer rather than the gateway's
// commits. One contract test suite runs against both.
package fakegateway
