"""Tests of the benchmark package (:mod:`bench`)."""
