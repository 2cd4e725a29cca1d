// Command grpcfloor is the smallest gRPC server `make bench` compares
// sandbox-agentd with: grpc-go serving only grpc.health.v1 and server
// reflection on a unix socket, built with the daemon's flags. Its idle RSS
// and its round trip are the floor any daemon built on grpc-go starts
// from on the machine measured.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
)

func main() {
	socket := flag.String("socket", "", "unix socket to serve on")
	tcp := flag.String("tcp", "", "also serve on this TCP address (host:port)")
	flag.Parse()
	if err := run(*socket, *tcp); err != nil {
		fmt.Fprintln(os.Stderr, "grpcfloor:", err)
		os.Exit(1)
	}
}

func run(socket, tcp string) error {
	if socket == "" {
		return fmt.Errorf("-socket is required")
	}
	l, err := net.Listen("unix", socket)
	if err != nil {
		return err
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, health.NewServer())
	reflection.Register(s)
	if tcp != "" {
		tl, err := net.Listen("tcp", tcp)
		if err != nil {
			return err
		}
		go func() { _ = s.Serve(tl) }()
	}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
		<-sig
		s.Stop()
	}()
	return s.Serve(l)
}
