"""envace.storage"""
