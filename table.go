package main

import (
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/mattn/go-runewidth"
)

// table lays out the rows of "ls" and "history" as text/tabwriter does
// with padding 2 and spaces (every column but the last as wide as its
// widest cell plus two), in one buffer: a listing of 100,000 leases
// formats in a fraction of the time text/tabwriter takes, which keeps a
// cell per allocation. Widths are terminal columns, as [cellWidth]
// measures them. Not safe for concurrent use.
type table struct {
	buf    []byte // the cells, back to back
	ends   []int  // the end of each cell in buf
	widths []int  // per column, in terminal columns
	cols   int
}

// newTable starts a table with the header's columns and room for about
// rows rows.
func newTable(rows int, header ...string) *table {
	t := &table{cols: len(header), widths: make([]int, len(header)),
		buf: make([]byte, 0, (rows+1)*len(header)*12), ends: make([]int, 0, (rows+1)*len(header))}
	for _, h := range header {
		t.text(h)
	}
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
	t.widths[col] = max(t.widths[col], cellWidth(t.buf[start:]))
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
		for pad := t.widths[col] + 2 - cellWidth(c); pad > 0; pad-- {
			line = append(line, ' ')
		}
	}
	return nil
}
