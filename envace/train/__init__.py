"""envace.train"""
