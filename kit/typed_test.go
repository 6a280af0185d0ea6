package kit_test

import (
	"os/exec"
	"strings"
	"testing"
)

// Through the root API, a handler typed to one event and Events of another
// do not compile together, whichever type the constructor returns (the
// Events' handler type, the handler's, the handler itself), nor in
// kittest.CheckWrites; the same
// program with one event type compiles, so the refusals are the types'.
func TestConsumeRefusesAHandlerOfAnotherEvent(t *testing.T) {
	if out, err := exec.Command("go", "build", "-o", "/dev/null", "./testdata/typed/match").CombinedOutput(); err != nil {
		t.Fatalf("the well-typed program does not compile: %v\n%s", err, out)
	}
	out, err := exec.Command("go", "build", "-o", "/dev/null", "./testdata/typed/mismatch").CombinedOutput()
	if err == nil {
		t.Fatal("a handler of OrderPaid wired with the Events of OrderPlaced compiled")
	}
	for _, want := range []string{
		"main.go:29:62: cannot use handler{} (value of struct type handler) as kit.Handler[OrderPlaced] value",
		"main.go:30:17: in call to kit.Consume, H (type kit.Handler[OrderPaid]) does not satisfy kit.Handler[E]",
		"main.go:32:17: in call to kit.Consume, H (type handler) does not satisfy kit.Handler[E]",
		"main.go:34:47: in call to kittest.CheckWrites, type handler of handler{} does not match inferred type kit.Handler[OrderPlaced]",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the compiler's refusal lacks %q:\n%s", want, out)
		}
	}
}
