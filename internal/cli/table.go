package cli

import (
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/mattn/go-runewidth"
)

// nameColumnWidth is the most terminal columns the RESOURCE column of
// "ls" and "history" takes: a name may be 255 bytes per component, and one
// such name would otherwise pad every row to its width.
const nameColumnWidth = 40

// table lays out the rows of "ls" and "history" as text/tabwriter does
// with padding 2 and spaces (every column but the last as wide as its
// widest cell plus two), in one buffer: a listing of 100,000 leases
// formats in a fraction of the time text/tabwriter takes, which keeps a
// cell per allocation. A column may be given a limit ([table.limit]): a
// cell wider than it does not widen the column but overflows its own row,
// two spaces before the next cell. Widths are terminal columns, as
// [cellWidth] measures them. Not safe for concurrent use.
type table struct {
	buf    []byte // the cells, back to back
	ends   []int  // the end of each cell in buf
	widths []int  // per column, in terminal columns
	limits []int  // per column, the widest cell that sets its width; 0: any
	cols   int
}

// newTable starts a table with the header's columns and room for about
// rows rows.
func newTable(rows int, header ...string) *table {
	t := &table{cols: len(header), widths: make([]int, len(header)), limits: make([]int, len(header)),
		buf: make([]byte, 0, (rows+1)*len(header)*12), ends: make([]int, 0, (rows+1)*len(header))}
	for _, h := range header {
		t.text(h)
	}
	return t
}

// limit caps column col at width terminal columns: a wider cell added
// after this call overflows its row (see [table]). It returns t.
func (t *table) limit(col, width int) *table {
	t.limits[col] = width
	return t
}

// grow makes room for about rows rows in all, once: cells already added
// are kept.
func (t *table) grow(rows int) {
	if want := (rows + 1) * t.cols; cap(t.ends) < want {
		t.ends = slices.Grow(t.ends, want-len(t.ends))
		t.buf = slices.Grow(t.buf, want*12-len(t.buf))
	}
}

// cell ends the current cell, appended to buf by the caller.
func (t *table) cell(start int) {
	col := len(t.ends) % t.cols
	if w := cellWidth(t.buf[start:]); t.limits[col] == 0 || w <= t.limits[col] {
		t.widths[col] = max(t.widths[col], w)
	}
	t.ends = append(t.ends, len(t.buf))
}

// cellWidth returns how many terminal columns c takes: one per byte when
// c is ASCII (nearly every cell), else its width by Unicode's East Asian
// Width and grapheme rules, as go-runewidth measures it (a wide CJK
// character takes two columns; a combining mark, a zero-width joiner or a
// byte order mark none; East Asian ambiguous characters one, or two under
// a CJK locale). Text/tabwriter counted runes, which misaligned such names.
func cellWidth(c []byte) int {
	for _, b := range c {
		if b >= 0x80 {
			return runewidth.StringWidth(string(c))
		}
	}
	return len(c)
}

func (t *table) text(s string) {
	start := len(t.buf)
	t.buf = append(t.buf, s...)
	t.cell(start)
}

func (t *table) uint(n uint64) {
	start := len(t.buf)
	t.buf = strconv.AppendUint(t.buf, n, 10)
	t.cell(start)
}

func (t *table) int(n int64) {
	start := len(t.buf)
	t.buf = strconv.AppendInt(t.buf, n, 10)
	t.cell(start)
}

// age adds a duration cell, rendered as [age] renders it.
func (t *table) age(d time.Duration) {
	start := len(t.buf)
	t.buf = appendAge(t.buf, d)
	t.cell(start)
}

// write writes the table to w, a line per row.
func (t *table) write(w io.Writer) error {
	var line []byte
	from := 0
	for i, end := range t.ends {
		col := i % t.cols
		c := t.buf[from:end]
		from = end
		line = append(line, c...)
		if col == t.cols-1 {
			line = append(line, '\n')
			if _, err := w.Write(line); err != nil {
				return err
			}
			line = line[:0]
			continue
		}
		for pad := max(t.widths[col]+2-cellWidth(c), 2); pad > 0; pad-- {
			line = append(line, ' ')
		}
	}
	return nil
}

// tableName renders a resource for a table: as it is, or Go-quoted when it
// holds control characters or spaces, which a name may contain but a
// terminal would obey (escape sequences) or a table would split on.
func tableName(r string) string {
	if !needsQuote(r) {
		return r
	}
	return strconv.Quote(r)
}

// needsQuote reports whether r holds a control character or a space (see
// tableName). Printable ASCII, what almost every name is, is decided a byte
// at a time.
func needsQuote(r string) bool {
	for i := 0; i < len(r); i++ {
		if c := r[i]; c <= ' ' || c >= 0x7f {
			return strings.ContainsFunc(r[i:], func(c rune) bool { return unicode.IsControl(c) || unicode.IsSpace(c) })
		}
	}
	return false
}

// age renders a duration for tables, rounded to seconds, as
// [time.Duration.String] renders it ("-1h2m3s", "45s", "0s").
func age(d time.Duration) string {
	return string(appendAge(nil, d))
}

// appendAge appends age(d) to b without allocating: a listing of 100,000
// leases renders 200,000 of them.
func appendAge(b []byte, d time.Duration) []byte {
	const limit = 1 << 62 // far beyond any lease; rounding cannot overflow below it
	if d <= -limit || d >= limit {
		if d < 0 {
			return append(append(b, '-'), d.Abs().Round(time.Second).String()...)
		}
		return append(b, d.Round(time.Second).String()...)
	}
	if d < 0 {
		b = append(b, '-')
		d = -d
	}
	secs := int64(d.Round(time.Second) / time.Second)
	h, m, sec := secs/3600, secs/60%60, secs%60
	if h > 0 {
		b = append(strconv.AppendInt(b, h, 10), 'h')
	}
	if h > 0 || m > 0 {
		b = append(strconv.AppendInt(b, m, 10), 'm')
	}
	return append(strconv.AppendInt(b, sec, 10), 's')
}
