module example.com/outside

go 1.26.0
