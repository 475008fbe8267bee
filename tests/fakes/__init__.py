"""Test doubles shared by the test suites."""
