package main

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// readmeFlagTable is the header of README.md's table of serve's flags: a flag (and its environment variable) and
// what it is for; the defaults are in `kvshmd serve -h` only.
const readmeFlagTable = "| Flag (env) | Meaning |"

// TestReadmeFlagTable: README.md's table of serve's flags names exactly the flags serve registers, each once, any
// environment variable it names is its flag's, and it states no defaults (no Default column: `kvshmd serve -h`
// holds them).
func TestReadmeFlagTable(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	flags, envs, err := readmeFlags(string(readme))
	if err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	want := new(serveOptions).register(fs)
	var registered []string
	fs.VisitAll(func(f *flag.Flag) { registered = append(registered, f.Name) })
	seen := map[string]bool{}
	for _, f := range flags {
		if seen[f] {
			t.Errorf("README's flag table names --%s twice", f)
		}
		seen[f] = true
		if _, ok := want[f]; !ok {
			t.Errorf("README's flag table names --%s, which serve does not register", f)
		}
	}
	for _, f := range registered {
		if !seen[f] {
			t.Errorf("README's flag table does not name --%s", f)
		}
	}
	for _, e := range envs {
		if !slices.ContainsFunc(e.flags, func(f string) bool { return want[f] == e.env }) {
			t.Errorf("README's flag table names %s beside %v: it is none of theirs", e.env, e.flags)
		}
	}
}

type readmeEnv struct {
	env   string
	flags []string // the flags of its row
}

var (
	readmeFlag = regexp.MustCompile("`--([a-z0-9-]+)`")
	readmeVar  = regexp.MustCompile("`(KVSHMD_[A-Z0-9_]+)`")
)

// readmeFlags returns the flags the first column of README's flag table names, in order, and the environment
// variables it names, each with its row's flags.
func readmeFlags(readme string) (flags []string, envs []readmeEnv, err error) {
	_, table, ok := strings.Cut(readme, "\n"+readmeFlagTable+"\n|---|---|\n")
	if !ok {
		return nil, nil, fmt.Errorf("README.md has no table headed %q and its rule (a Default column would restate what `kvshmd serve -h` holds)", readmeFlagTable)
	}
	table, _, _ = strings.Cut(table, "\n\n")
	for _, row := range strings.Split(table, "\n") {
		cells := strings.Split(row, " | ")
		if !strings.HasPrefix(row, "| ") || len(cells) < 2 {
			return nil, nil, fmt.Errorf("README's flag table: row %q is not | flags | meaning |", row)
		}
		var rowFlags []string
		for _, m := range readmeFlag.FindAllStringSubmatch(cells[0], -1) {
			rowFlags = append(rowFlags, m[1])
		}
		if len(rowFlags) == 0 {
			return nil, nil, fmt.Errorf("README's flag table: row %q names no flag", row)
		}
		flags = append(flags, rowFlags...)
		for _, m := range readmeVar.FindAllStringSubmatch(cells[0], -1) {
			envs = append(envs, readmeEnv{env: m[1], flags: rowFlags})
		}
	}
	return flags, envs, nil
}
