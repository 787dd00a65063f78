module github.com/leasefs/leasefs

go 1.26.0

require (
	github.com/BurntSushi/toml v1.6.0
	github.com/anishathalye/porcupine v1.3.1
	github.com/coreos/go-systemd/v22 v22.7.0
	github.com/google/renameio/v2 v2.0.2
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/spf13/cobra v1.10.2
	golang.org/x/sys v0.50.0
	lukechampine.com/blake3 v1.4.1
)

require (
	github.com/cpuguy83/go-md2man/v2 v2.0.6 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/klauspost/cpuid/v2 v2.0.9 // indirect
	github.com/russross/blackfriday/v2 v2.1.0 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	go.yaml.in/yaml/v3 v3.0.4 // indirect
)
