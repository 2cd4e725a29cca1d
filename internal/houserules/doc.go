// Package houserules holds tests that keep DESIGN.md's rules of the house
// true: which packages may import which, and what the daemon links.
package houserules
