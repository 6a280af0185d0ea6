package buffered

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/database"
)

// queryTx runs the package's own statements in a GORM transaction through its
// database/sql transaction: with PostgreSQL's $n placeholders, arrays passed
// whole to pgx (GORM would expand a slice into a list), and planned for their
// parameters at every execution (database.CustomPlan): they read tables that
// start empty and grow by thousands of rows a second, and a generic plan made
// for the empty tables made the processing collapse to a few hundred
// messages a second within a minute.
type queryTx struct {
	ctx context.Context
	tx  *sql.Tx
}

func txOf(gtx *gorm.DB) (*queryTx, error) {
	tx, ok := gtx.Statement.ConnPool.(*sql.Tx)
	if !ok {
		return nil, errors.New("buffered: not in a database/sql transaction")
	}
	return &queryTx{ctx: gtx.Statement.Context, tx: tx}, nil
}

func (q *queryTx) query(sql string, args ...any) (*sql.Rows, error) {
	return q.tx.QueryContext(q.ctx, sql, append([]any{database.CustomPlan}, args...)...)
}

func (q *queryTx) exec(sql string, args ...any) (int64, error) {
	res, err := q.tx.ExecContext(q.ctx, sql, append([]any{database.CustomPlan}, args...)...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// strings runs a query returning one text column and collects the values.
func (q *queryTx) strings(sql string, args ...any) (map[string]bool, error) {
	rows, err := q.query(sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out[v] = true
	}
	return out, rows.Err()
}

// values builds the VALUES list of a multi-row INSERT with numbered placeholders.
type values struct {
	b    strings.Builder
	args []any
}

func (v *values) row(cols ...any) {
	if len(v.args) > 0 {
		v.b.WriteString(", ")
	}
	v.b.WriteByte('(')
	for i, c := range cols {
		if i > 0 {
			v.b.WriteString(", ")
		}
		v.args = append(v.args, c)
		v.b.WriteString("$" + strconv.Itoa(len(v.args)))
	}
	v.b.WriteByte(')')
}

func (v *values) sql() string { return v.b.String() }
