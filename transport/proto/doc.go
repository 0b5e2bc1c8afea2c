// Package moonraftpb is the generated gRPC API of moonraft (service
// moonraft.v1.Master), from moonraft.proto. Do not edit the *.pb.go files;
// change moonraft.proto and run `make proto`.
package moonraftpb
