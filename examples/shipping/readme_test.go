package shipping_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The README's "Make it yours" walks through this example: every code block
// it shows there must be in the example's files as written.
func TestReadmeQuotesTheExample(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(readme)
	start := strings.Index(section, "## Make it yours")
	if start < 0 {
		t.Fatal(`README has no "## Make it yours" section`)
	}
	section = section[start+1:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
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
		t.Fatalf("found %d code blocks in Make it yours, want the handler, the service, the migration and the main", len(blocks))
	}
	for _, b := range blocks {
		if !strings.Contains(sources.String(), b[1]) {
			t.Errorf("README quotes code that is not in examples/shipping as written:\n%s", b[1])
		}
	}
}
