package payment_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"strconv"
	"testing"

	"github.com/inbox-template/payment-service/internal/payment"
)

// The outbox relay's bench (kit/internal/cmd/bench-relay) fills the outbox
// with the payment service's OrderPaid rows, its names written out there
// because the kit imports no service: they are the service's, field for
// field, or the bench measures rows the service never writes.
func TestBenchRelayWritesThePaymentServicesRows(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "../../kit/internal/cmd/bench-relay/main.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	consts := map[string]string{}
	var fields []string
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ValueSpec:
			for i, name := range n.Names {
				if i < len(n.Values) {
					if lit, ok := n.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						consts[name.Name], _ = strconv.Unquote(lit.Value)
					}
				}
			}
		case *ast.TypeSpec:
			if st, ok := n.Type.(*ast.StructType); ok && n.Name.Name == "orderPaidEvent" {
				for _, fd := range st.Fields.List {
					tag, _ := strconv.Unquote(fd.Tag.Value)
					fields = append(fields, fd.Names[0].Name+" "+reflect.StructTag(tag).Get("json"))
				}
			}
		}
		return true
	})
	for name, want := range map[string]string{
		"producer": payment.Service().Name, "exchangePayments": payment.ExchangePayments, "keyOrderPaid": payment.KeyOrderPaid,
	} {
		if consts[name] != want {
			t.Errorf("bench-relay's %s is %q, the payment service's %q", name, consts[name], want)
		}
	}
	var want []string
	for f := range reflect.TypeFor[payment.OrderPaid]().Fields() {
		want = append(want, f.Name+" "+f.Tag.Get("json"))
	}
	if !reflect.DeepEqual(fields, want) {
		t.Errorf("bench-relay's orderPaidEvent has the fields %q, the payment service's OrderPaid %q", fields, want)
	}
}
