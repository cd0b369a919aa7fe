"""envace.evaluate"""
