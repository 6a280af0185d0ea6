package ops_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/inbox-template/payment-service/kit"
	"github.com/inbox-template/payment-service/kit/internal/consumer"
	"github.com/inbox-template/payment-service/kit/internal/ops"
	"github.com/inbox-template/payment-service/kit/internal/service"
)

// env prints every variable with its description and the service's own
// default: derived names from the service's name and event, the handler's
// settings after the kit's.
func TestEnvPrintsEveryVariableWithItsDefault(t *testing.T) {
	opts := service.WithSettings(service.Options{
		Name: "refund-service", Event: "refund-requested", Exchange: "payments", RoutingKey: "refund.requested",
	}, func(k *service.Kit, s *struct {
		BankURL string `envconfig:"BANK_URL" default:"http://localhost:9000" desc:"the bank's API"`
	}) (consumer.Handler, error) {
		return nil, nil
	})
	var out strings.Builder
	if err := ops.Command(context.Background(), opts, []string{"env"}, nil, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"\nQUEUE=refund-service.refund-requested\n",
		"\nDEAD_LETTER_EXCHANGE=refund-service.dlx\n",
		"\nEXCHANGE=payments\n",
		"\n# the bank's API\nBANK_URL=http://localhost:9000\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("env lacks %q:\n%s", want, out.String())
		}
	}
	if err := ops.Command(context.Background(), opts, []string{"env", "x"}, nil, &out); err == nil {
		t.Error("env x: no error")
	}
}

// A service with no outside calls refuses IDEMPOTENCY_KEY_TTL: env leaves it
// out, so that its output starts the service.
func TestEnvLeavesOutWhatTheServiceRefuses(t *testing.T) {
	opts := service.Options{Name: "notes", Event: "note-taken", Exchange: "x", RoutingKey: "k", NoOutsideCalls: true,
		NewHandler: func(k *service.Kit) (consumer.Handler, error) { return nil, nil }}
	var out strings.Builder
	if err := ops.Command(context.Background(), opts, []string{"env"}, nil, &out); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "IDEMPOTENCY_KEY_TTL") || !strings.Contains(out.String(), "\nQUEUE=notes.note-taken\n") {
		t.Errorf("env of a service with no outside calls:\n%s", out.String())
	}
}

// The outbox's settings are a publishing service's: env prints them for one
// that publishes, and leaves them out for one that does not, as the start-up
// log does.
func TestEnvPrintsTheOutboxsSettingsForAPublisherOnly(t *testing.T) {
	for _, publishes := range [][]string{nil, {"notes"}} {
		opts := service.Options{Name: "notes", Event: "note-taken", Exchange: "x", RoutingKey: "k", Publishes: publishes,
			NewHandler: func(k *service.Kit) (consumer.Handler, error) { return nil, nil }}
		var out strings.Builder
		if err := ops.Command(context.Background(), opts, []string{"env"}, nil, &out); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(out.String(), "\nOUTBOX_BATCH="); got != (publishes != nil) {
			t.Errorf("env of a service publishing %q prints OUTBOX_BATCH: %v, want %v", publishes, got, publishes != nil)
		}
	}
}

// A service that pins settings (Options.Requires) prints the pinned values:
// the defaults would not start it. From a review: an ordered generated
// service's .env.example said INBOX_MODE=inline, and it refused to start.
func TestEnvPrintsWhatTheServiceRequires(t *testing.T) {
	opts := service.Options{Name: "notes", Event: "note-taken", Exchange: "x", RoutingKey: "k",
		Requires:   service.Requirements{Mode: service.ModeBuffered, SingleActiveConsumer: true},
		NewHandler: func(k *service.Kit) (consumer.Handler, error) { return nil, nil }}
	var out strings.Builder
	if err := ops.Command(context.Background(), opts, []string{"env"}, nil, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "\nINBOX_MODE=buffered\n") || !strings.Contains(out.String(), "\nSINGLE_ACTIVE_CONSUMER=true\n") {
		t.Errorf("env of a service that requires the buffered mode and a single active consumer:\n%s", out.String())
	}
}

// A command line the commands do not take is refused with the mistake and one
// line naming the program's help, not the whole usage; help itself prints the
// usage under the program's name.
func TestUsageErrorsPointToHelp(t *testing.T) {
	opts := service.Options{Name: "refund-service", Event: "refund-requested", Exchange: "x", RoutingKey: "k",
		NewHandler: func(k *service.Kit) (consumer.Handler, error) { return nil, nil }}
	for _, args := range [][]string{
		{"bogus"}, {"env", "x"}, {"migrate", "x"}, {"dlq"}, {"dlq", "peek"}, {"dlq", "list", "--bogus"},
		{"dlq", "list", "extra"}, {"version", "x"}, {"dlq", "replay"}, {"inbox"}, {"inbox", "vacuum"}, {"inbox", "retry"},
		{"inbox", "skip"}, {"inbox", "export"}, {"outbox"}, {"outbox", "flush"}, {"outbox", "retry"}, {"outbox", "skip"},
	} {
		err := ops.Run(context.Background(), opts, args, nil, io.Discard)
		if err == nil {
			t.Errorf("%q: no error", args)
			continue
		}
		lines := strings.Split(err.Error(), "\n")
		if len(lines) != 2 || lines[1] != "run 'refund-service help' for usage" || strings.Contains(lines[0], "SERVICE") {
			t.Errorf("%q: error %q, want the mistake and then \"run 'refund-service help' for usage\"", args, err)
		}
	}
	if err := ops.Run(context.Background(), opts, []string{"bogus"}, nil, io.Discard); !errors.Is(err, ops.ErrUnknown) {
		t.Errorf("bogus: %v, want ErrUnknown", err)
	}
	var out strings.Builder
	if err := ops.Run(context.Background(), opts, []string{"help"}, nil, &out); err != nil ||
		!strings.HasPrefix(out.String(), "usage: refund-service [command]\n") || strings.Contains(out.String(), "SERVICE") {
		t.Errorf("help: %v\n%s", err, out.String())
	}
}

// version names the kit's release; which module version the binary holds
// depends on how it was built (internal/e2e checks a service built on the
// kit at a version, before and after go get): the kit's own test binary
// holds it as its main module.
func TestVersionNamesTheKitsRelease(t *testing.T) {
	var out strings.Builder
	opts := service.Options{Name: "refund-service"}
	if err := ops.Run(context.Background(), opts, []string{"version"}, nil, &out); err != nil ||
		!strings.HasPrefix(out.String(), "refund-service: kit "+kit.Version+" (module github.com/inbox-template/payment-service/kit not a dependency") {
		t.Errorf("version: %v\n%s", err, out.String())
	}
}
