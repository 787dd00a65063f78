package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/leasefs/leasefs/internal/procfs"
)

// completeLeaseNames completes a lease name for "leasefs lock": the files
// and namespaces under --mount, else under the mount [lockMount] finds,
// with namespaces ending in "/" so that completion goes on.
func completeLeaseNames(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveDefault // CMD after NAME: files and commands
	}
	// A --mount already typed is completed under as it is: lock itself
	// refuses one that is no leasefs mount.
	mnt, _ := cmd.Flags().GetString("mount")
	if mnt == "" {
		var err error
		if mnt, err = lockMount("", procfs.Mounts()); err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
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

// fixCompletionCmd makes an unknown shell ("leasefs completion tcsh") a
// usage error, exit 2: cobra's completion command only has subcommands
// (bash, zsh, fish, powershell), and a command that cannot run answers an
// unknown one with its help and exit 0.
func fixCompletionCmd(root *cobra.Command) {
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() != "completion" {
			continue
		}
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(cmd *cobra.Command, a []string) error {
			if len(a) == 0 {
				return cmd.Help()
			}
			var shells []string
			for _, sc := range cmd.Commands() {
				if sc.IsAvailableCommand() {
					shells = append(shells, sc.Name())
				}
			}
			return usageError{fmt.Errorf("unknown shell %q: want one of %s", a[0], strings.Join(shells, ", "))}
		}
	}
}
