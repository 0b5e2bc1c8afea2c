module jsonv2bench

go 1.26.0

require github.com/moonraft/moonraft v0.0.0

require (
	github.com/fatih/color v1.13.0 // indirect
	github.com/go-json-experiment/json v1.27.2
	github.com/hashicorp/go-hclog v1.6.3 // indirect
	github.com/mattn/go-colorable v0.1.13 // indirect
	github.com/mattn/go-isatty v0.0.22 // indirect
	golang.org/x/sys v0.49.0 // indirect
)

replace github.com/moonraft/moonraft => ../..
