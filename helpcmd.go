package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// rootLong is the root help: the file protocol in five lines
// (docs/PROTOCOL.md §3, §6).
const rootLong = `leasefs mounts exclusive writer leases as files. In a mount m:

  set -C; : > m/name      reserve the lease on "name" (fails if someone holds it)
  cat m/name              first read: the token, once; then the status document
  echo "$tok" >| m/name   renew (heartbeat); a TOML command releases or annotates
  rm m/name               release; ls -l m shows who holds what
  flock m/name cmd        hold the lease exactly as long as cmd runs

Protocol reference: docs/PROTOCOL.md. Start with "leasefs mount --help".`

// completeLeaseNames completes a lease name for "leasefs lock": the files
// and namespaces under the mount [lockMount] finds, with namespaces ending
// in "/" so that completion goes on.
func completeLeaseNames(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveDefault // CMD after NAME: files and commands
	}
	flag, _ := cmd.Flags().GetString("mount")
	mnt, err := lockMount(flag)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	dir, _ := filepath.Split(toComplete)
	entries, err := os.ReadDir(filepath.Join(mnt, dir))
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, e := range entries {
		name := dir + e.Name()
		if !strings.HasPrefix(name, toComplete) {
			continue
		}
		if e.IsDir() {
			name += "/"
		}
		out = append(out, name)
	}
	return out, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
}

// completeDirs completes a directory flag such as --state or --mount.
func completeDirs(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return nil, cobra.ShellCompDirectiveFilterDirs
}

// registerDirCompletion makes every --state and --mount flag of cmd and its
// subcommands complete directories.
func registerDirCompletion(cmd *cobra.Command) {
	for _, name := range []string{"state", "mount"} {
		if cmd.Flags().Lookup(name) != nil {
			_ = cmd.RegisterFlagCompletionFunc(name, completeDirs)
		}
	}
	for _, c := range cmd.Commands() {
		registerDirCompletion(c)
	}
}

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
