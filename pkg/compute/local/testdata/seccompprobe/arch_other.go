//go:build !amd64

package main

// int80 has no other architecture to call through here.
func int80() uintptr { return 0 }

// archProbes has nothing to add outside amd64.
func archProbes(func(name string, trap uintptr, a ...uintptr)) {}
