package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"text/tabwriter"
)

// TestTableMatchesTabwriter checks that the table of "ls" and "history"
// lays out exactly as text/tabwriter with padding 2 did, for cells of
// every width, multibyte runes included.
func TestTableMatchesTabwriter(t *testing.T) {
	rows := [][]string{
		{"RESOURCE", "MODE", "UID", "EXPIRES IN"},
		{"a", "token", "0", "4m59s"},
		{"ci/deploy-äöü", "handle", "1000", "-"},
		{strings.Repeat("x", 40), "token", "4294967295", "999h59m59s"},
		{"", "", "", ""},
	}
	var want bytes.Buffer
	tw := tabwriter.NewWriter(&want, 0, 4, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	if err := tw.Flush(); err != nil {
		t.Fatal(err)
	}
	tb := newTable(len(rows), rows[0]...)
	for _, r := range rows[1:] {
		for _, c := range r {
			tb.text(c)
		}
	}
	var got bytes.Buffer
	if err := tb.write(&got); err != nil {
		t.Fatal(err)
	}
	if got.String() != want.String() {
		t.Fatalf("table:\n%q\ntabwriter:\n%q", got.String(), want.String())
	}
}
