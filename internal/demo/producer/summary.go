package producer

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Summary reports one run. Published counts each message of the load once;
// copies sent again after a reconnect are counted in RepublishedAfterReconnect
// only. Confirmed counts broker acks, which a returned message also gets.
type Summary struct {
	RunID                     string         `json:"run_id"`
	Seed                      uint64         `json:"seed"`
	Exchange                  string         `json:"exchange"`
	RoutingKey                string         `json:"routing_key"`
	Orders                    int            `json:"orders"` // distinct order ids published
	Published                 int            `json:"published"`
	Duplicates                int            `json:"duplicates"`
	Republishes               int            `json:"republishes"`
	Poison                    map[string]int `json:"poison"` // by PoisonKind, every kind listed
	PoisonTotal               int            `json:"poison_total"`
	Confirmed                 int            `json:"confirmed"`
	Nacked                    int            `json:"nacked"`
	Returned                  int            `json:"returned"`
	Reconnects                int            `json:"reconnects"`
	RepublishedAfterReconnect int            `json:"republished_after_reconnect"`
	DurationSeconds           float64        `json:"duration_seconds"`
	OK                        bool           `json:"ok"`
	Error                     string         `json:"error,omitempty"`
}

func newSummary(cfg Config) Summary {
	s := Summary{
		RunID:      cfg.Load.RunID,
		Seed:       cfg.Load.Seed,
		Exchange:   cfg.Broker.Exchange,
		RoutingKey: cfg.Broker.RoutingKey,
		Poison:     map[string]int{},
	}
	for _, k := range PoisonKinds() {
		s.Poison[string(k)] = 0
	}
	return s
}

// count records that m was handed to the broker.
func (s *Summary) count(m Message) {
	s.Published++
	switch m.Kind {
	case KindOrder:
		s.Orders++
	case KindDuplicate:
		s.Duplicates++
	case KindRepublish:
		s.Republishes++
	case KindPoison:
		s.Poison[string(m.Poison)]++
		s.PoisonTotal++
	}
}

// WriteJSON writes the summary as one indented JSON object.
func (s Summary) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(s); err != nil {
		return fmt.Errorf("write summary: %w", err)
	}
	return nil
}

// WriteText writes the summary as aligned lines for a terminal.
func (s Summary) WriteText(w io.Writer) error {
	result := "ok"
	if !s.OK {
		result = "FAILED: " + s.Error
	}
	lines := [][2]string{
		{"run id", s.RunID},
		{"seed", fmt.Sprint(s.Seed)},
		{"exchange / routing key", s.Exchange + " / " + s.RoutingKey},
		{"orders", fmt.Sprint(s.Orders)},
		{"messages published", fmt.Sprint(s.Published)},
		{"  duplicates (same id)", fmt.Sprint(s.Duplicates)},
		{"  republishes (new id)", fmt.Sprint(s.Republishes)},
		{"  poison", s.poisonText()},
		{"confirmed", fmt.Sprint(s.Confirmed)},
		{"nacked", fmt.Sprint(s.Nacked)},
		{"returned", fmt.Sprint(s.Returned)},
		{"reconnects", fmt.Sprint(s.Reconnects)},
		{"republished after reconnect", fmt.Sprint(s.RepublishedAfterReconnect)},
		{"duration", fmt.Sprintf("%.2fs", s.DurationSeconds)},
		{"result", result},
	}
	var b strings.Builder
	for _, l := range lines {
		fmt.Fprintf(&b, "%-29s %s\n", l[0]+":", l[1])
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write summary: %w", err)
	}
	return nil
}

func (s Summary) poisonText() string {
	var parts []string
	for _, k := range PoisonKinds() {
		if n := s.Poison[string(k)]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, n))
		}
	}
	if len(parts) == 0 {
		return fmt.Sprint(s.PoisonTotal)
	}
	return fmt.Sprintf("%d (%s)", s.PoisonTotal, strings.Join(parts, ", "))
}
