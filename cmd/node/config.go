package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/hashicorp/hcl"
	"github.com/hashicorp/hcl/hcl/ast"
	"github.com/hashicorp/hcl/hcl/token"
	"github.com/moonraft/moonraft/errcode"
)

// applyConfigFile reads an HCL (or JSON) file whose keys are the flag
// names — `raft-addr = "10.0.0.1:7200"`, with `_` accepted for `-` — and
// sets every flag it names that was not given on the command line (flags
// win). A list value is joined with commas (`peers = ["n0=…", "n1=…"]`).
// An unknown key, a block, or a key given twice is an error that names the
// key and its line.
func applyConfigFile(fs *flag.FlagSet, path string, onCommandLine map[string]bool) error {
	src, err := os.ReadFile(path)
	if err != nil {
		return errcode.New(errcode.FileNotFound, "config file: %v", err)
	}
	file, err := hcl.ParseBytes(src)
	if err != nil {
		return errcode.New(errcode.InvalidParams, "config file %s: %v", path, err)
	}
	list, ok := file.Node.(*ast.ObjectList)
	if !ok {
		return errcode.New(errcode.InvalidParams, "config file %s: expected key = value lines", path)
	}
	seen := map[string]int{}
	for _, item := range list.Items {
		line := item.Pos().Line
		raw := keyText(item.Keys[0].Token)
		bad := func(format string, args ...any) error {
			return errcode.New(errcode.InvalidParams, "config file %s, line %d, key %q: %s", path, line, raw, fmt.Sprintf(format, args...))
		}
		if len(item.Keys) != 1 {
			return bad("blocks are not supported: write one `flag-name = value` per line")
		}
		name := strings.ReplaceAll(raw, "_", "-")
		switch {
		case name == "config":
			return bad("a config file cannot name another one")
		case fs.Lookup(name) == nil:
			return bad("unknown key (the keys are the flag names of `moonraft --help`)")
		case seen[name] != 0:
			return bad("given twice (first on line %d)", seen[name])
		}
		seen[name] = line
		val, err := valueText(item.Val)
		if err != nil {
			return bad("%v", err)
		}
		if onCommandLine[name] {
			continue
		}
		if err := fs.Set(name, val); err != nil {
			return bad("value %q: %v", val, err)
		}
	}
	return nil
}

func keyText(t token.Token) string {
	if t.Type == token.STRING {
		if s, ok := literal(t); ok {
			return s
		}
	}
	return t.Text
}

// literal is the text of a literal token as a flag would take it. Token's
// Value panics on malformed input, so it is guarded.
func literal(t token.Token) (s string, ok bool) {
	defer func() {
		if recover() != nil {
			s, ok = "", false
		}
	}()
	switch t.Type {
	case token.STRING, token.HEREDOC:
		v, _ := t.Value().(string)
		return v, true
	case token.NUMBER, token.FLOAT, token.BOOL, token.IDENT:
		return t.Text, true
	}
	return "", false
}

func valueText(n ast.Node) (string, error) {
	switch v := n.(type) {
	case *ast.LiteralType:
		if s, ok := literal(v.Token); ok {
			return s, nil
		}
		return "", fmt.Errorf("value %s is not a string, number or bool", v.Token.Text)
	case *ast.ListType:
		parts := make([]string, 0, len(v.List))
		for _, e := range v.List {
			lit, ok := e.(*ast.LiteralType)
			if !ok {
				return "", fmt.Errorf("a list may only hold strings or numbers")
			}
			s, ok := literal(lit.Token)
			if !ok {
				return "", fmt.Errorf("list element %s is not a string, number or bool", lit.Token.Text)
			}
			parts = append(parts, s)
		}
		return strings.Join(parts, ","), nil
	}
	return "", fmt.Errorf("blocks and objects are not supported: give a string, number, bool or list")
}
