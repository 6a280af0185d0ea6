// Command hello is the program of testenv's build test.
package main

import "fmt"

func main() { fmt.Println("hello") }
