package main

func writeHealReport(o healOptions, runs []*healRun, v []healVerdict) error { return nil }
