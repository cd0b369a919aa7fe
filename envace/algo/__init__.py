"""envace.algo"""
