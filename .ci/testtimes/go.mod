module testtimes

go 1.26.8
