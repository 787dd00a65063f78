package cli

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// newManCmd is "leasefs man [DIR]": the section-1 manual pages generated
// from the commands' own help (cobra/doc). Without DIR it prints the
// leasefs(1) page on stdout; with DIR it writes a page per command there.
func newManCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "man [DIR]",
		Short: "Print the leasefs(1) manual page, or write every command's page into DIR",
		Long: `Without DIR, print the leasefs(1) manual page on stdout. With DIR, write
a manual page (section 1) for leasefs and for each of its commands into
DIR (leasefs.1, leasefs-mount.1, leasefs-lock.1, ...), creating it if
needed. The pages are generated from the commands' own help; the protocol
reference they cite, docs/PROTOCOL.md, is in the leasefs source tree and
is not installed.`,
		Example: `  leasefs man | man -l -
  leasefs man /usr/local/share/man/man1 && mandb -q
  leasefs man "$HOME/man" && man -l "$HOME/man/leasefs-lock.1"`,
		Args: optionalArg("DIR"),
		RunE: func(cmd *cobra.Command, a []string) error {
			header := &doc.GenManHeader{Title: "LEASEFS", Section: "1", Source: "leasefs " + version, Manual: "leasefs manual"}
			root := cmd.Root()
			root.DisableAutoGenTag = true
			if len(a) == 0 {
				return doc.GenMan(root, header, stdout)
			}
			if err := os.MkdirAll(a[0], 0o755); err != nil {
				return err
			}
			if err := doc.GenManTree(root, header, a[0]); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "manual pages written to %s\n", a[0])
			return nil
		},
	}
}
