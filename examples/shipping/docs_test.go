package shipping_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// docs/writing-a-service.md walks through this example: every code block it
// shows must be in the example's files as written.
func TestDocsQuoteTheExample(t *testing.T) {
	page, err := os.ReadFile("../../docs/writing-a-service.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(page)
	var sources strings.Builder
	for _, f := range []string{"shipping.go", "carrier.go", "migrations/00001_shipments.sql", "../../cmd/shipping-service/main.go"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sources.Write(b)
	}
	blocks := regexp.MustCompile("(?s)```(?:go|sql)\n(.*?)```").FindAllStringSubmatch(section, -1)
	if len(blocks) < 4 {
		t.Fatalf("found %d code blocks in docs/writing-a-service.md, want the handler, the service, the migration and the main", len(blocks))
	}
	for _, b := range blocks {
		if !strings.Contains(sources.String(), b[1]) {
			t.Errorf("docs/writing-a-service.md quotes code that is not in examples/shipping as written:\n%s", b[1])
		}
	}
}
