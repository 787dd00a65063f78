package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// newManCmd is "leasefs man DIR": section-1 manual pages of every command,
// generated from the commands' own help (cobra/doc).
func newManCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "man DIR",
		Short: "Write the manual pages of every command into DIR",
		Long: `Write a manual page (section 1) for leasefs and each of its commands into
DIR, generated from the commands' own help.`,
		Example: `  leasefs man /usr/local/share/man/man1 && mandb -q
  leasefs man /tmp/man && man -l /tmp/man/leasefs-lock.1`,
		Args: func(_ *cobra.Command, a []string) error {
			if len(a) != 1 {
				return usageError{errors.New("want one DIR")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, a []string) error {
			if err := os.MkdirAll(a[0], 0o755); err != nil {
				return err
			}
			header := &doc.GenManHeader{Title: "LEASEFS", Section: "1", Source: "leasefs " + version, Manual: "leasefs manual"}
			root := cmd.Root()
			root.DisableAutoGenTag = true
			if err := doc.GenManTree(root, header, a[0]); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "manual pages written to %s\n", a[0])
			return nil
		},
	}
}
