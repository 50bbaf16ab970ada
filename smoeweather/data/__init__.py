"""smoeweather.data"""
